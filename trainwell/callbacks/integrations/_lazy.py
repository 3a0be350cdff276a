"""``LazyTrackerCallback``: what the run-based tracker callbacks share (Comet, DVCLive, SwanLab, Trackio, W&B, ClearML).

Upstream's pattern, written once: a callback starts its run (``setup``) at train begin, or at the first event that
has something to log when the trainer is only evaluating or predicting; it logs only while its run exists on the
world main process. Each tracker keeps its own ``setup``, its own attributes (``_wandb``, ``_experiment``, ``live``...,
upstream's names) and its own way of writing a log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base import TrainerCallback

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["LazyTrackerCallback"]


class LazyTrackerCallback(TrainerCallback):
    """A tracker callback set up once, on first use.

    A subclass implements ``setup(args, state, model)`` (which sets ``self._initialized = True``), ``_logging(state)``
    (whether this process writes to the run now) and ``_log(args, state, logs)`` (one ``on_log`` dict), and
    ``_log_predict(state, metrics)``; a tracker that does not log ``predict()``'s metrics (upstream's DVCLive and
    ClearML callbacks) sets ``on_predict = TrainerCallback.on_predict``.
    """

    _initialized = False

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Start the run (the tracker's own)."""
        raise NotImplementedError

    def _ensure_setup(self, args: Any, state: TrainerState, model: Any) -> None:
        if not self._initialized:
            self.setup(args, state, model)

    def _logging(self, state: TrainerState) -> bool:
        raise NotImplementedError

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        raise NotImplementedError

    def _log_predict(self, state: TrainerState, metrics: dict[str, Any]) -> None:
        raise NotImplementedError

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                       **kwargs: Any) -> None:
        """Start the run."""
        self._ensure_setup(args, state, model)

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Log the values (starting the run first when nothing did yet)."""
        self._ensure_setup(args, state, model)
        if logs and self._logging(state):
            self._log(args, state, logs)

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, Any],
                   **kwargs: Any) -> None:
        """Log ``predict()``'s metrics (starting the run first when nothing did yet)."""
        self._ensure_setup(args, state, kwargs.get("model"))
        if self._logging(state):
            self._log_predict(state, metrics)
