"""``metric_for_best_model``: reading it from the evaluation metrics and recording the best value in the state."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
    from ..utils.trainer_state import TrainerState

__all__ = ["MissingMetricError", "is_new_best", "metric_value"]


class MissingMetricError(KeyError):
    """``metric_for_best_model`` is not among the evaluation metrics (a ``KeyError``, as upstream raises)."""

    def __str__(self) -> str:  # the message, not KeyError's quoted repr
        return str(self.args[0])


def metric_value(metrics: Mapping[str, float], name: str) -> float:
    """``metrics[name]`` with the ``eval_`` prefix added as upstream; a message listing the names otherwise."""
    key = name if name.startswith("eval_") else f"eval_{name}"
    if key not in metrics:
        raise MissingMetricError(
            f"The `metric_for_best_model` training argument is set to {key!r}, which is not found in the evaluation "
            f"metrics. The available evaluation metrics are: {list(metrics)}. Return {key[5:]!r} from "
            "compute_metrics, or set metric_for_best_model to one of these (with or without the 'eval_' prefix).")
    return metrics[key]


def is_new_best(args: TrainingArguments, state: TrainerState, metrics: dict[str, float] | None) -> bool:
    """Record ``best_metric`` / ``best_global_step`` in ``state``; True when ``metrics`` improve on the best so far."""
    name = args.metric_for_best_model
    if not metrics or not name:
        return False
    value = metric_value(metrics, name)
    better = (lambda a, b: a > b) if args.greater_is_better else (lambda a, b: a < b)
    if state.best_metric is None or better(value, state.best_metric):
        state.best_metric = value
        state.best_global_step = state.global_step
        return True
    return False
