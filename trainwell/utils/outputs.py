"""The result tuples of the public API: what ``train``, ``evaluation_loop`` and ``predict`` return, what
``compute_metrics`` receives, and the best trial of a hyper-parameter search."""

from __future__ import annotations

from typing import Any, NamedTuple


class TrainOutput(NamedTuple):
    """What ``Trainer.train`` returns."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class EvalPrediction:
    """What ``compute_metrics`` receives: predictions, label ids and (optionally) the inputs.

    Unpacks like a tuple: ``preds, labels = eval_pred`` (or three values when inputs are included).
    """

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None) -> None:
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self._items = (predictions, label_ids) + ((inputs,) if inputs is not None else ())

    def __iter__(self):
        return iter(self._items)

    def __getitem__(self, idx: int) -> Any:
        return self._items[idx]

    def __len__(self) -> int:
        return len(self._items)


class EvalLoopOutput(NamedTuple):
    """What ``Trainer.evaluation_loop`` returns."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    """What ``Trainer.predict`` returns."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


class BestRun(NamedTuple):
    """The best trial of a hyper-parameter search."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any = None
