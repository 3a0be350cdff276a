"""``TrainerCallback``: the base class of every callback, with one no-op method per event.

Every method receives ``args`` (the ``TrainingArguments``), ``state`` (``TrainerState``), ``control``
(``TrainerControl``) and the keyword arguments ``model``, ``processing_class``, ``tokenizer`` (the
same object, deprecated name), ``optimizer``, ``lr_scheduler``, ``train_dataloader`` and
``eval_dataloader``, plus ``logs`` for ``on_log`` and ``metrics`` for ``on_evaluate``/``on_predict``.
A callback changes only ``control`` (and its own attributes); returning a ``TrainerControl`` replaces
the control. See :mod:`trainwell.callbacks.events` for the order in which the events fire.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, TypeVar

from .events import NOOP_MARKER

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["TrainerCallback"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _noop(func: _F) -> _F:
    """Mark a base method as a no-op so the CallbackHandler skips callbacks that do not override it."""
    setattr(func, NOOP_MARKER, True)
    return func


class TrainerCallback:
    """Base class for objects that inspect the training loop and take decisions through ``control``.

    Subclass it and override the events you need. Example::

        class PrintLoss(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                if state.is_local_process_zero and "loss" in logs:
                    print(state.global_step, logs["loss"])
    """

    @_noop
    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the end of ``Trainer.__init__``."""

    @_noop
    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the beginning of training (``state.max_steps`` and step intervals are set)."""

    @_noop
    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the end of training."""

    @_noop
    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the beginning of an epoch."""

    @_noop
    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the end of an epoch, before the epoch's log/evaluate/save."""

    @_noop
    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the beginning of an optimizer step (its first micro-batch with gradient accumulation)."""

    @_noop
    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> Any:
        """Fired after backward and gradient clipping, before ``optimizer.step()``: gradients are readable."""

    @_noop
    def on_optimizer_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired after ``optimizer.step()`` and before gradients are zeroed."""

    @_noop
    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired after each gradient-accumulation micro-batch that is not the last of its step."""

    @_noop
    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired at the end of an optimizer step (``state.global_step`` already counts it)."""

    @_noop
    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired after an evaluation; keyword ``metrics`` holds the evaluation metrics."""

    @_noop
    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, Any],
                   **kwargs: Any) -> Any:
        """Fired after a successful prediction with its ``metrics`` (upstream's signature)."""

    @_noop
    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired after a checkpoint was saved."""

    @_noop
    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired after logging; keyword ``logs`` holds the logged values."""

    @_noop
    def on_prediction_step(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired after each evaluation or prediction batch."""

    @_noop
    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> Any:
        """Fired before pushing to a model hub (kept for upstream compatibility)."""
