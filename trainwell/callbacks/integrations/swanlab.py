"""``SwanLabCallback``: SwanLab experiments (``pip install trainwell[swanlab]``; ``SWANLAB_MODE=offline`` works
offline, writing ``SWANLAB_LOG_DIR``, default ``./swanlog``).

Environment variables (upstream's): ``SWANLAB_PROJECT``, ``SWANLAB_MODE``, ``SWANLAB_LOG_DIR``, ``SWANLAB_API_KEY``,
``SWANLAB_RUN_ID`` + ``SWANLAB_RESUME`` (resume a run; ``resume_from_checkpoint`` implies ``allow``),
``SWANLAB_LOG_MODEL`` (not supported by SwanLab yet: a warning).
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from ._common import SINGLE_VALUE_SCALARS, check_installed, require, run_config
from ._lazy import LazyTrackerCallback
from .tensorboard import rewrite_logs

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerState

__all__ = ["SwanLabCallback"]

logger = logging.getLogger(__name__)


def _active_run(swanlab: Any) -> Any:
    """The run the user started, if any (newer swanlab raises instead of returning None)."""
    try:
        return swanlab.get_run()
    except RuntimeError:
        return None


class SwanLabCallback(LazyTrackerCallback):
    """Logs the config and metrics (``train/x``, ``eval/x``, totals under ``single_value/``) to SwanLab."""

    def __init__(self) -> None:
        check_installed("swanlab")
        self._swanlab: Any = None
        self._initialized = False
        self._log_model = os.getenv("SWANLAB_LOG_MODEL")

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Start (or join) the experiment and record the config."""
        self._initialized = True
        if not state.is_world_process_zero:
            return
        self._swanlab = swanlab = require("swanlab")
        init_args: dict[str, Any] = {"project": os.getenv("SWANLAB_PROJECT")}
        if os.getenv("SWANLAB_LOG_DIR"):
            init_args["log_dir"] = os.getenv("SWANLAB_LOG_DIR")
        names = [n for n in (args.run_name, state.trial_name) if n is not None]
        if names:
            init_args["experiment_name"] = "-".join(names)
        if os.getenv("SWANLAB_RUN_ID"):
            init_args["id"] = os.getenv("SWANLAB_RUN_ID")
        if os.getenv("SWANLAB_RESUME"):
            init_args["resume"] = os.getenv("SWANLAB_RESUME")
        elif getattr(args, "resume_from_checkpoint", None):
            init_args["resume"] = "allow"
        if _active_run(swanlab) is None:
            # swanlab >= 0.10 parses SWANLAB_<A>_<B> as nested settings and rejects upstream's SWANLAB_PROJECT /
            # SWANLAB_LOG_DIR; they are passed as arguments instead, and hidden from it while it starts
            hidden = {k: os.environ.pop(k) for k in ("SWANLAB_PROJECT", "SWANLAB_LOG_DIR") if k in os.environ}
            try:
                swanlab.init(**init_args)
            finally:
                os.environ.update(hidden)
        swanlab.config["FRAMEWORK"] = "trainwell"
        swanlab.config.update(run_config(args, model))
        if model is not None and hasattr(model, "parameters"):
            swanlab.config.update({"model_num_parameters": sum(p.numel() for p in model.parameters())})
        if self._log_model is not None:
            logger.warning("SWANLAB_LOG_MODEL is set, but SwanLab cannot store models yet: ignored.")

    def _logging(self, state: TrainerState) -> bool:
        return self._swanlab is not None and state.is_world_process_zero

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """Log the values at ``state.global_step``."""
        totals = {f"single_value/{k}": v for k, v in logs.items() if k in SINGLE_VALUE_SCALARS}
        series = rewrite_logs({k: v for k, v in logs.items() if k not in SINGLE_VALUE_SCALARS})
        self._swanlab.log({**totals, **series, "train/global_step": state.global_step}, step=state.global_step)

    def _log_predict(self, state: TrainerState, metrics: dict[str, Any]) -> None:
        self._swanlab.log(rewrite_logs(metrics))
