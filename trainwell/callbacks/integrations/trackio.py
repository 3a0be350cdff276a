"""``TrackioCallback``: Trackio runs (``pip install trainwell[trackio]``), stored locally (``TRACKIO_DIR``) unless a
Space is given.

The project is ``args.project`` when the arguments have it, else ``TRACKIO_PROJECT``, else ``"huggingface"``
(upstream's default); the Space is ``args.trackio_space_id`` or ``TRACKIO_SPACE_ID`` (read by trackio itself), its
Bucket ``args.trackio_bucket_id``. As upstream: a run logged to a Space is frozen into a static Space at the end
(``args.trackio_static_space_id``, or a name made from the project; ``False``: not), and a local run is synced to a
static Space when the model is pushed to the Hub.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from typing import TYPE_CHECKING, Any

from ._common import SINGLE_VALUE_SCALARS, check_installed, require, run_config
from ._lazy import LazyTrackerCallback
from .tensorboard import rewrite_logs

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["TrackioCallback"]


class TrackioCallback(LazyTrackerCallback):
    """Logs the config and metrics (against ``train/global_step``) to a Trackio run; finished at train end."""

    def __init__(self) -> None:
        check_installed("trackio")
        self._trackio: Any = None
        self._initialized = False
        self._space_id: str | None = None

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Start the run with the config."""
        self._initialized = True
        if not state.is_world_process_zero:
            return
        self._trackio = trackio = require("trackio")
        init_args: dict[str, Any] = {"project": _project(args), "name": args.run_name, "resume": "allow",
                                     "config": run_config(args, model)}
        space_id = getattr(args, "trackio_space_id", None)
        if space_id:
            init_args["space_id"] = space_id
            init_args["private"] = getattr(args, "hub_private_repo", None)
        if getattr(args, "trackio_bucket_id", None):
            init_args["bucket_id"] = args.trackio_bucket_id
        trackio.init(**init_args)
        current = getattr(getattr(trackio, "context_vars", None), "current_space_id", None)
        self._space_id = current.get() if current is not None else space_id  # the full id trackio resolved

    def _logging(self, state: TrainerState) -> bool:
        return self._trackio is not None and state.is_world_process_zero

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """Log the values (end-of-run totals excepted, as upstream) with ``train/global_step``."""
        series = rewrite_logs({k: v for k, v in logs.items() if k not in SINGLE_VALUE_SCALARS})
        self._trackio.log({**series, "train/global_step": state.global_step})

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Finish the run; a run logged to a Space is then frozen into a static one (see the module docstring)."""
        if self._initialized and self._logging(state):
            try:
                self._trackio.finish()
            finally:
                self._initialized = False
            if self._space_id and getattr(args, "trackio_static_space_id", None) is not False:
                try:
                    self._trackio.freeze(space_id=self._space_id, project=_project(args),
                                         new_space_id=_static_space_id(args),
                                         private=getattr(args, "hub_private_repo", None))
                except Exception as err:
                    logger.warning("Trackio could not freeze the Space after training: %s", err)

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """A local run (no Space) is synced to a static Space on the Hub when the model is pushed, unless
        ``trackio_static_space_id`` is False."""
        if self._trackio is None or not state.is_world_process_zero or self._space_id:
            return
        if getattr(args, "trackio_static_space_id", None) is False:
            return
        self._trackio.sync(project=_project(args), sdk="static", space_id=_static_space_id(args),
                           private=getattr(args, "hub_private_repo", None),
                           bucket_id=getattr(args, "trackio_bucket_id", None), force=True)

    def _log_predict(self, state: TrainerState, metrics: dict[str, Any]) -> None:
        self._trackio.log(rewrite_logs(metrics))


def _project(args: Any) -> str:
    return getattr(args, "project", None) or os.getenv("TRACKIO_PROJECT") or "huggingface"


def _static_space_id(args: Any) -> str:
    """``args.trackio_static_space_id``, else a Hub-safe name made from the project with a short random suffix."""
    given = getattr(args, "trackio_static_space_id", None)
    if given:
        return str(given)
    name = re.sub(r"[^a-z0-9._-]", "-", _project(args).strip().lower().replace("/", "-"))
    name = re.sub(r"-+", "-", name).strip("-_.") or "trackio-project"
    return f"{name[:81].rstrip('-')}-static-{secrets.token_hex(3)}"
