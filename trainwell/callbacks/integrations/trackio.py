"""``TrackioCallback``: Trackio runs (``pip install trainwell[trackio]``), stored locally (``TRACKIO_DIR``) unless a
Space is given.

The project is ``args.project`` when the arguments have it, else ``TRACKIO_PROJECT``, else ``"huggingface"``
(upstream's default); the Space is ``args.trackio_space_id`` or ``TRACKIO_SPACE_ID`` (read by trackio itself).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ._common import SINGLE_VALUE_SCALARS, check_installed, require, run_config
from ._lazy import LazyTrackerCallback
from .tensorboard import rewrite_logs

if TYPE_CHECKING:
    from ..state import TrainerControl, TrainerState

__all__ = ["TrackioCallback"]


class TrackioCallback(LazyTrackerCallback):
    """Logs the config and metrics (against ``train/global_step``) to a Trackio run; finished at train end."""

    def __init__(self) -> None:
        check_installed("trackio")
        self._trackio: Any = None
        self._initialized = False

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Start the run with the config."""
        self._initialized = True
        if not state.is_world_process_zero:
            return
        self._trackio = trackio = require("trackio")
        project = getattr(args, "project", None) or os.getenv("TRACKIO_PROJECT") or "huggingface"
        init_args: dict[str, Any] = {"project": project, "name": args.run_name, "resume": "allow",
                                     "config": run_config(args, model)}
        space_id = getattr(args, "trackio_space_id", None)
        if space_id:
            init_args["space_id"] = space_id
            init_args["private"] = getattr(args, "hub_private_repo", None)
        trackio.init(**init_args)

    def _logging(self, state: TrainerState) -> bool:
        return self._trackio is not None and state.is_world_process_zero

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """Log the values (end-of-run totals excepted, as upstream) with ``train/global_step``."""
        series = rewrite_logs({k: v for k, v in logs.items() if k not in SINGLE_VALUE_SCALARS})
        self._trackio.log({**series, "train/global_step": state.global_step})

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Finish the run."""
        if self._initialized and self._logging(state):
            try:
                self._trackio.finish()
            finally:
                self._initialized = False

    def _log_predict(self, state: TrainerState, metrics: dict[str, Any]) -> None:
        self._trackio.log(rewrite_logs(metrics))
