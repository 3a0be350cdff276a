"""``EarlyStoppingCallback``: stops training when the evaluation metric stops improving."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..utils.trainer_state import ExportableState
from ..utils.option_enums import IntervalStrategy
from .base import TrainerCallback

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["EarlyStoppingCallback"]

logger = logging.getLogger(__name__)


def _greater_is_better(args: Any, metric_name: str) -> bool:
    """``args.greater_is_better``, or upstream's default when unset: False only for ``*loss`` metrics."""
    value = getattr(args, "greater_is_better", None)
    if value is None:
        return not metric_name.endswith("loss")
    return bool(value)


class EarlyStoppingCallback(TrainerCallback, ExportableState):
    """Stops training after ``early_stopping_patience`` evaluations without improvement.

    The metric is ``args.metric_for_best_model`` (``eval_`` prefix added when missing); an evaluation
    improves when it beats ``state.best_metric`` (the best before this evaluation) by more than
    ``early_stopping_threshold`` in the direction of ``args.greater_is_better``. Needs an evaluation
    strategy other than ``no``; use with ``load_best_model_at_end=True`` to end on the best weights.
    The patience counter is saved in checkpoints (``state()``).
    """

    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0) -> None:
        if early_stopping_patience < 1:
            raise ValueError(
                f"early_stopping_patience must be >= 1, got {early_stopping_patience}; it counts the "
                "evaluations without improvement tolerated before stopping."
            )
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold or 0.0
        self.early_stopping_patience_counter = 0

    def check_metric_value(self, args: Any, state: TrainerState, control: TrainerControl, metric_value: float) -> None:
        """Reset the counter when ``metric_value`` improves on ``state.best_metric``, else increment it."""
        name = getattr(args, "metric_for_best_model", None) or "loss"
        best = state.best_metric
        improved_direction = (
            best is None
            or (metric_value > best if _greater_is_better(args, name) else metric_value < best)
        )
        if improved_direction and (best is None or abs(metric_value - best) > self.early_stopping_threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Check that the arguments allow early stopping."""
        if not getattr(args, "load_best_model_at_end", False):
            logger.warning(
                "Using EarlyStoppingCallback without load_best_model_at_end=True: once training is "
                "finished, the best model will not be loaded automatically."
            )
        if getattr(args, "metric_for_best_model", None) is None:
            raise ValueError(
                "EarlyStoppingCallback requires `metric_for_best_model` (e.g. 'eval_loss'); set it in "
                "TrainingArguments (load_best_model_at_end=True sets it to 'loss' by default)."
            )
        if args.eval_strategy == IntervalStrategy.NO:
            raise ValueError(
                "EarlyStoppingCallback requires evaluations during training, but eval_strategy='no'; "
                "set TrainingArguments(eval_strategy='steps' or 'epoch')."
            )

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Update the counter from ``metrics`` and ask to stop when patience is exhausted."""
        metric_name = args.metric_for_best_model
        if not metric_name.startswith("eval_"):
            metric_name = f"eval_{metric_name}"
        metric_value = (kwargs.get("metrics") or {}).get(metric_name)
        if metric_value is None:
            logger.warning(
                "Early stopping needs the metric %r (metric_for_best_model) but the evaluation did not "
                "return it, so early stopping is disabled for this evaluation.",
                metric_name,
            )
            return
        self.check_metric_value(args, state, control, float(metric_value))
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict[str, dict[str, Any]]:
        """Constructor arguments and the patience counter, for checkpoints."""
        return {
            "args": {
                "early_stopping_patience": self.early_stopping_patience,
                "early_stopping_threshold": self.early_stopping_threshold,
            },
            "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter},
        }
