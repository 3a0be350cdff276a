"""``CometCallback``: Comet experiments (``pip install trainwell[comet_ml]``).

Environment variables: ``COMET_MODE`` (upstream's ``get``/``get_or_create``/``create`` choose how the experiment
is found or created; the older ``offline``/``online``/``disabled`` spellings are honoured too),
``COMET_START_ONLINE`` (``false``: offline), ``COMET_PROJECT_NAME``, ``COMET_OFFLINE_DIRECTORY`` (where an offline
experiment's archive goes), ``COMET_LOG_ASSETS`` (``true``: upload ``output_dir`` at train end), ``COMET_API_KEY``
and everything else comet_ml reads itself.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from ._common import check_installed, env_flag, require, run_config
from ._lazy import LazyTrackerCallback
from .tensorboard import rewrite_logs

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["CometCallback"]

logger = logging.getLogger(__name__)

_MODES = ("get", "get_or_create", "create")


def _mode_and_online() -> tuple[str | None, bool | None, bool]:
    """``COMET_MODE`` as ``(mode, online, disabled)``."""
    value = os.getenv("COMET_MODE", "").strip().lower()
    if not value or value in _MODES:
        return value or None, None, False
    if value in ("offline", "online"):
        return None, value == "online", False
    if value == "disabled":
        return None, None, True
    raise ValueError(f"COMET_MODE={value!r} is not valid: use one of {_MODES}, or 'offline', 'online', 'disabled'.")


class CometCallback(LazyTrackerCallback):
    """Logs the arguments and model config as parameters and the logs as metrics to one Comet experiment.

    Only the world main process logs. During hyper-parameter search each trial gets its own experiment.
    """

    def __init__(self) -> None:
        check_installed("comet_ml")
        self._initialized = False
        self._log_assets = False
        self._experiment: Any = None

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Start (or find) the experiment and log the parameters."""
        self._initialized = True
        self._log_assets = env_flag("COMET_LOG_ASSETS")
        if not state.is_world_process_zero:
            return
        mode, online, disabled = _mode_and_online()
        if disabled:
            logger.info("COMET_MODE=disabled: CometCallback will not log anything.")
            return
        if state.is_hyper_param_search:
            mode = "create"  # one experiment per trial
        comet_ml = require("comet_ml")
        config = comet_ml.ExperimentConfig(name=args.run_name,
                                           offline_directory=os.getenv("COMET_OFFLINE_DIRECTORY") or None)
        self._experiment = comet_ml.start(project_name=os.getenv("COMET_PROJECT_NAME") or None, mode=mode,
                                          online=online, experiment_config=config)
        if model is not None:
            self._experiment.set_model_graph(model)
        params: dict[str, Any] = {"args": args.to_dict() if hasattr(args, "to_dict") else dict(vars(args))}
        config_dict = {k: v for k, v in run_config(args, model).items() if k not in params["args"]}
        if config_dict:
            params["config"] = config_dict
        self._experiment.log_parameters(params, nested_support=True)
        if state.is_hyper_param_search:
            self._experiment.log_optimization(optimization_id=state.trial_name, parameters=state.trial_params)

    def _logging(self, state: TrainerState) -> bool:
        return self._experiment is not None and state.is_world_process_zero

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """Log the values as metrics at ``state.global_step`` (``eval_x`` as ``eval/x``, others ``train/x``)."""
        self._experiment.log_metrics(rewrite_logs(logs), step=state.global_step, epoch=state.epoch)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Upload ``output_dir`` with ``COMET_LOG_ASSETS``; end a trial's experiment."""
        if not (self._initialized and state.is_world_process_zero and self._experiment is not None):
            return
        if self._log_assets:
            self._experiment.log_asset_folder(args.output_dir, recursive=True, log_file_name=True,
                                              step=state.global_step)
        if state.is_hyper_param_search:
            self._experiment.end()
            self._experiment = None
            self._initialized = False

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, Any],
                   **kwargs: Any) -> None:
        """Log ``predict()``'s metrics (an experiment started here gets no model graph, as upstream)."""
        self._ensure_setup(args, state, None)
        if self._logging(state):
            self._log(args, state, metrics)
