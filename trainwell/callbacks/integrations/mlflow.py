"""``MLflowCallback``: logs parameters and metrics to MLflow (``pip install trainwell[mlflow]``).

Environment variables (upstream names): ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``,
``MLFLOW_RUN_ID`` (resume that run), ``MLFLOW_NESTED_RUN``, ``MLFLOW_TAGS`` (json dict),
``MLFLOW_FLATTEN_PARAMS``, ``MLFLOW_MAX_LOG_PARAMS`` (log only the first N), ``HF_MLFLOW_LOG_ARTIFACTS`` (also
log ``output_dir`` and checkpoints).
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import TYPE_CHECKING, Any

from ..base import TrainerCallback
from ._common import flatten
from .tensorboard import as_scalar
from ...utils.trackers import is_installed

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["MLflowCallback"]

logger = logging.getLogger(__name__)

_TRUE = {"1", "ON", "YES", "TRUE"}
_INVALID_KEY_CHARS = re.compile(r"[^0-9A-Za-z_\-. :/]")


def _env_flag(name: str) -> bool:
    return os.getenv(name, "FALSE").upper() in _TRUE


def _import_mlflow() -> Any:
    """Import mlflow, or explain how to install it."""
    try:
        import mlflow
    except ImportError as err:
        raise ImportError(
            "MLflowCallback (report_to='mlflow') needs the mlflow package: `pip install trainwell[mlflow]`, "
            "or remove 'mlflow' from report_to."
        ) from err
    return mlflow


def _mlflow_installed() -> bool:
    return is_installed("mlflow")


def _args_to_params(args: Any, model: Any) -> dict[str, Any]:
    """The run parameters: the model config (when it has one) overlaid with the arguments."""
    if hasattr(args, "to_sanitized_dict"):
        params = dict(args.to_sanitized_dict())
    elif hasattr(args, "to_dict"):
        params = dict(args.to_dict())
    else:
        params = dict(vars(args))
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_dict"):
        params = {**config.to_dict(), **params}
    return params


class MLflowCallback(TrainerCallback):
    """Sends the arguments (as params) and the logs (as metrics) to MLflow from the world main process.

    A run is started at train begin unless one is already active (a nested run with
    ``MLFLOW_NESTED_RUN``, a resumed one with ``MLFLOW_RUN_ID``); a run it started is ended at
    train end.
    """

    MAX_PARAM_VAL_LENGTH = 6000
    MAX_PARAMS_TAGS_PER_BATCH = 100

    def __init__(self) -> None:
        if not _mlflow_installed():
            _import_mlflow()  # raises the error naming the pip command, at construction as upstream
        self._ml_flow: Any = None
        self._initialized = False
        self._auto_end_run = False
        self._log_artifacts = False

    def setup(self, args: Any, state: TrainerState, model: Any) -> None:
        """Import mlflow, start (or join) a run and log the parameters."""
        self._ml_flow = _import_mlflow()
        self._log_artifacts = _env_flag("HF_MLFLOW_LOG_ARTIFACTS")
        tracking_uri = os.getenv("MLFLOW_TRACKING_URI")
        if tracking_uri:
            self._ml_flow.set_tracking_uri(tracking_uri)
        if state.is_world_process_zero:
            self._start_run(args)
            self._log_params(_args_to_params(args, model))
            tags = os.getenv("MLFLOW_TAGS")
            if tags:
                self._ml_flow.set_tags(json.loads(tags))
        self._initialized = True

    def _start_run(self, args: Any) -> None:
        nested = _env_flag("MLFLOW_NESTED_RUN")
        run_id = os.getenv("MLFLOW_RUN_ID")
        if self._ml_flow.active_run() is not None and not nested and not run_id:
            return  # log into the run the user started
        experiment = os.getenv("MLFLOW_EXPERIMENT_NAME")
        if experiment:
            self._ml_flow.set_experiment(experiment)
        kwargs: dict[str, Any] = {"nested": nested}
        if run_id:
            kwargs["run_id"] = run_id
        else:
            kwargs["run_name"] = getattr(args, "run_name", None)
        self._ml_flow.start_run(**kwargs)
        self._auto_end_run = True

    def _log_params(self, params: dict[str, Any]) -> None:
        if _env_flag("MLFLOW_FLATTEN_PARAMS"):
            params = flatten(params)
        for name, value in list(params.items()):
            if len(str(value)) > self.MAX_PARAM_VAL_LENGTH:
                logger.warning(
                    "Not logging param %r to MLflow: its value is longer than %d characters.",
                    name,
                    self.MAX_PARAM_VAL_LENGTH,
                )
                del params[name]
        items = list(params.items())
        max_params = os.getenv("MLFLOW_MAX_LOG_PARAMS")
        if max_params and max_params.isdigit():  # upstream: log only the first N parameters
            items = items[: int(max_params)]
        for start in range(0, len(items), self.MAX_PARAMS_TAGS_PER_BATCH):
            self._ml_flow.log_params(dict(items[start : start + self.MAX_PARAMS_TAGS_PER_BATCH]))

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Start the run and log the parameters."""
        if not self._initialized:
            self.setup(args, state, kwargs.get("model"))

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Log the numeric values as metrics at ``state.global_step``."""
        if not self._initialized:
            self.setup(args, state, kwargs.get("model"))
        if not state.is_world_process_zero or not logs:
            return
        metrics: dict[str, float] = {}
        for key, value in logs.items():
            scalar = as_scalar(value)
            if scalar is None:
                logger.warning("Not logging %r to MLflow: %s is not a number.", key, type(value).__name__)
                continue
            metrics[_INVALID_KEY_CHARS.sub("_", key)] = scalar
        if metrics:
            self._ml_flow.log_metrics(metrics=metrics, step=state.global_step)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """With ``HF_MLFLOW_LOG_ARTIFACTS``, upload the checkpoint folder just written."""
        if self._initialized and state.is_world_process_zero and self._log_artifacts:
            name = f"checkpoint-{state.global_step}"
            folder = os.path.join(args.output_dir, name)
            if os.path.isdir(folder):
                self._ml_flow.log_artifacts(folder, artifact_path=name)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Upload ``output_dir`` when asked and end the run this callback started."""
        if not (self._initialized and state.is_world_process_zero):
            return
        if self._log_artifacts:
            self._ml_flow.log_artifacts(args.output_dir)
        if self._auto_end_run and self._ml_flow.active_run() is not None:
            self._ml_flow.end_run()
        self._auto_end_run = False
