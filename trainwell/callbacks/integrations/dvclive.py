"""``DVCLiveCallback``: DVCLive files (``pip install trainwell[dvclive]``): ``dvclive/metrics.json``,
``dvclive/params.yaml`` and one ``.tsv`` per metric under ``dvclive/plots/metrics``.

``HF_DVCLIVE_LOG_MODEL``: ``true`` logs the final model (``output_dir/last``, or ``best`` with
``load_best_model_at_end``) as an artifact at train end; ``all`` logs ``output_dir`` at each checkpoint.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Literal

from ._common import check_installed, env_flag, require
from ..base import TrainerCallback
from ._lazy import LazyTrackerCallback
from ...checkpoint.weights import save_model_weights

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["DVCLiveCallback"]

logger = logging.getLogger(__name__)


class DVCLiveCallback(LazyTrackerCallback):
    """Logs the arguments as params and the logs as metrics (one DVCLive step per log) on the world main process.

    Args:
        live: a ``dvclive.Live`` to log into; by default one is created (``Live(**kwargs)``) at train begin.
        log_model: ``True`` (final model at train end), ``"all"`` (``output_dir`` at each save), or ``None``
            (read ``HF_DVCLIVE_LOG_MODEL``).
    """

    on_predict = TrainerCallback.on_predict  # predict()'s metrics are not logged (as upstream)

    def __init__(self, live: Any = None, log_model: Literal["all"] | bool | None = None, **kwargs: Any) -> None:
        check_installed("dvclive")
        self._initialized = False
        self.live: Any = None
        self._live_kwargs = kwargs
        if live is not None:
            from dvclive import Live

            if not isinstance(live, Live):
                raise RuntimeError(f"DVCLiveCallback(live=...) expects a dvclive.Live, got {type(live).__name__}.")
            self.live = live
        self._log_model = log_model
        if log_model is None:
            if env_flag("HF_DVCLIVE_LOG_MODEL"):
                self._log_model = True
            elif os.getenv("HF_DVCLIVE_LOG_MODEL", "").strip().lower() == "all":
                self._log_model = "all"

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Create the ``Live`` (unless given) and log the arguments as params."""
        self._initialized = True
        if state.is_world_process_zero:
            if self.live is None:
                self.live = require("dvclive").Live(**self._live_kwargs)
            self.live.log_params(args.to_dict() if hasattr(args, "to_dict") else dict(vars(args)))

    def _logging(self, state: TrainerState) -> bool:
        return state.is_world_process_zero

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """Log each number under DVCLive's standard name (``eval_loss`` -> ``eval/loss``), then step."""
        from dvclive.plots import Metric
        from dvclive.utils import standardize_metric_name

        for key, value in logs.items():
            if Metric.could_log(value):
                self.live.log_metric(standardize_metric_name(key, "dvclive.huggingface"), value)
            else:
                logger.warning("Not logging %r to DVCLive: %s is not a number.", key, type(value).__name__)
        self.live.next_step()

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """With ``log_model="all"``, log ``output_dir``."""
        if self._log_model == "all" and self._initialized and state.is_world_process_zero:
            self.live.log_artifact(args.output_dir)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                     **kwargs: Any) -> None:
        """With ``log_model=True``, save and log the final model; end the ``Live``."""
        if not (self._initialized and state.is_world_process_zero):
            return
        if self._log_model is True and model is not None:
            name = "best" if args.load_best_model_at_end else "last"
            folder = os.path.join(args.output_dir, name)
            save_model_weights(model, folder, safe_serialization=args.save_safetensors)
            processing_class = kwargs.get("processing_class")
            if processing_class is not None and hasattr(processing_class, "save_pretrained"):
                processing_class.save_pretrained(folder)
            self.live.log_artifact(folder, name=name, type="model", copy=True)
        self.live.end()
