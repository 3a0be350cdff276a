"""The training events (one source of truth) and the ``CallbackHandler`` that fires them.

Firing order of one training run (``Trainer.train``)::

    on_init_end                      end of Trainer.__init__
    on_train_begin                   control.should_training_stop is reset first
    for each epoch:
        on_epoch_begin               control.should_epoch_stop is reset first
        for each optimizer step (gradient_accumulation_steps micro-batches):
            on_step_begin            at the step's first micro-batch; log/evaluate/save flags reset first
            on_substep_end           after each micro-batch that is not the step's last (accumulation)
            on_pre_optimizer_step    after backward and gradient clipping, before optimizer.step()
            on_optimizer_step        after optimizer.step(), before gradients are zeroed
            on_step_end              after global_step += 1 and state.epoch is updated
            on_log                   if control.should_log      (flag reset first)
            on_evaluate              if control.should_evaluate (flag reset first; evaluation runs
                                     on_prediction_step per batch before it)
            on_save                  if control.should_save     (flag reset first)
        on_epoch_end                 then on_log / on_evaluate / on_save as control says
    on_train_end                     after the best model was reloaded (load_best_model_at_end)

Outside training: ``Trainer.evaluate`` fires ``on_prediction_step`` per batch then ``on_evaluate``;
``Trainer.predict`` fires ``on_prediction_step`` per batch then ``on_predict``; ``on_push_begin``
fires before pushing to a model hub (kept for compatibility).

Dispatch is cheap: for every event the handler keeps the bound methods of the callbacks that actually override
it, recomputed whenever the callback list changes (also in place: the list tells the handler), so a per-step
event nobody listens to is a no-op function, and the keywords every callback receives are built once (again
only when one of them is reassigned), not per event.
"""

from __future__ import annotations

import logging
from typing import Any

from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["EVENTS", "QUIET_EVENT", "CallbackHandler"]

logger = logging.getLogger(__name__)

EVENTS: tuple[str, ...] = (
    "on_init_end",
    "on_train_begin",
    "on_epoch_begin",
    "on_step_begin",
    "on_substep_end",
    "on_pre_optimizer_step",
    "on_optimizer_step",
    "on_step_end",
    "on_log",
    "on_evaluate",
    "on_save",
    "on_epoch_end",
    "on_train_end",
    "on_prediction_step",
    "on_predict",
    "on_push_begin",
)

# Marker set by trainwell.callbacks.base on its no-op methods; read here (instead of importing the
# base class) so that events.py does not depend on the callbacks package.
NOOP_MARKER = "_trainwell_noop"

# The handler's attributes passed to every callback as keywords (processing_class also as ``tokenizer``).
_COMMON_ATTRS = frozenset(
    {"model", "processing_class", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader"}
)


def _listens(callback: Any, event: str) -> bool:
    """Whether ``callback`` has a real (non no-op) handler for ``event``."""
    method = getattr(callback, event, None)
    if method is None or not callable(method):
        return False
    func = getattr(method, "__func__", method)
    return not getattr(func, NOOP_MARKER, False)


class CallbackHandler:
    """Holds the callbacks of a trainer and fires each event on them in order.

    Every ``on_<event>(args, state, control, **kwargs)`` method calls each listening callback with
    ``args, state, control`` and the keywords ``model``, ``processing_class``, ``tokenizer`` (the same
    object), ``optimizer``, ``lr_scheduler``, ``train_dataloader``, ``eval_dataloader`` plus the
    event's own (``logs``, ``metrics``...). A callback returning a ``TrainerControl`` replaces
    ``control``; the (possibly replaced) control is returned.
    """

    def __init__(
        self,
        callbacks: list[Any] | None,
        model: Any,
        processing_class: Any,
        optimizer: Any,
        lr_scheduler: Any,
    ) -> None:
        self._callbacks: list[Any] = _CallbackList(self)
        self._listeners: dict[str, list[Any]] = {event: [] for event in EVENTS}
        self._methods: dict[str, list[Any]] = {event: [] for event in EVENTS}
        self._common: dict[str, Any] | None = None
        self.model = model
        self.processing_class = processing_class
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_dataloader: Any = None
        self.eval_dataloader: Any = None
        for callback in callbacks or []:
            self.add_callback(callback)
        if not any(_is_flow_callback(cb) for cb in self._callbacks):
            logger.warning(
                "The Trainer will not work properly without a DefaultFlowCallback in its callbacks "
                "(it decides when to log, evaluate, save and stop). Current callbacks:\n%s",
                self.callback_list,
            )

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in _COMMON_ATTRS:  # the cached keywords of call_event are stale
            self.__dict__["_common"] = None

    # -- registry -----------------------------------------------------------------------------
    @property
    def callbacks(self) -> list[Any]:
        """The callbacks in firing order (change it with add/pop/remove_callback)."""
        return self._callbacks

    @callbacks.setter
    def callbacks(self, value: list[Any]) -> None:
        self._callbacks = _CallbackList(self, value)
        self._refresh()

    @property
    def tokenizer(self) -> Any:
        """Deprecated upstream alias of ``processing_class``."""
        return self.processing_class

    @property
    def callback_list(self) -> str:
        """The class names of the callbacks, one per line."""
        return "\n".join(type(cb).__name__ for cb in self._callbacks)

    def add_callback(self, callback: Any) -> None:
        """Append a callback instance, or instantiate and append a callback class."""
        instance = callback() if isinstance(callback, type) else callback
        cls = callback if isinstance(callback, type) else type(callback)
        if any(type(cb) is cls for cb in self._callbacks):
            logger.warning(
                "You are adding a %s to the callbacks of this Trainer, but there is already one. "
                "The current list of callbacks is:\n%s",
                cls.__name__,
                self.callback_list,
            )
        self._callbacks.append(instance)
        self._refresh()

    def pop_callback(self, callback: Any) -> Any:
        """Remove and return the callback (for a class: its first instance); ``None`` if absent."""
        found = self._find(callback)
        if found is not None:
            self._callbacks.remove(found)
            self._refresh()
        return found

    def remove_callback(self, callback: Any) -> None:
        """Remove the callback (for a class: its first instance); does nothing if absent."""
        self.pop_callback(callback)

    def _find(self, callback: Any) -> Any:
        if isinstance(callback, type):
            return next((cb for cb in self._callbacks if isinstance(cb, callback)), None)
        return next((cb for cb in self._callbacks if cb is callback), None)

    def _refresh(self) -> None:
        """Recompute, per event, the callbacks that override it (and their bound methods); a per-step event nobody
        listens to becomes a no-op function on this instance, so the step pays a call and nothing else."""
        self._listeners = {
            event: [cb for cb in self._callbacks if _listens(cb, event)] for event in EVENTS
        }
        self._methods = {event: [getattr(cb, event) for cb in listeners]
                         for event, listeners in self._listeners.items()}
        for event, quiet in _QUIET_STEP_EVENTS.items():
            if self._listeners[event] or getattr(type(self), event) is not getattr(CallbackHandler, event):
                self.__dict__.pop(event, None)  # the class's method fires them (a subclass's override too)
            else:
                self.__dict__[event] = quiet

    # -- dispatch -----------------------------------------------------------------------------
    def call_event(
        self, event: str, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Fire ``event`` on every listening callback; return the resulting control."""
        methods = self._methods[event]
        if not methods:
            return control
        common = self._common
        if common is None:
            common = self._common = {
                "model": self.model,
                "processing_class": self.processing_class,
                "tokenizer": self.processing_class,
                "optimizer": self.optimizer,
                "lr_scheduler": self.lr_scheduler,
                "train_dataloader": self.train_dataloader,
                "eval_dataloader": self.eval_dataloader,
            }
        if kwargs:  # the event's own keywords win over the common ones; the cached dict is never changed
            common = {**common, **kwargs}
        for method in methods:
            result = method(args, state, control, **common)
            if isinstance(result, TrainerControl):
                control = result
        return control

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """End of ``Trainer.__init__``."""
        return self.call_event("on_init_end", args, state, control, **kwargs)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """Start of training; resets ``should_training_stop`` first."""
        control.should_training_stop = False
        return self.call_event("on_train_begin", args, state, control, **kwargs)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """End of training."""
        return self.call_event("on_train_end", args, state, control, **kwargs)

    def on_epoch_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """Start of an epoch; resets ``should_epoch_stop`` first."""
        control.should_epoch_stop = False
        return self.call_event("on_epoch_begin", args, state, control, **kwargs)

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """End of an epoch."""
        return self.call_event("on_epoch_end", args, state, control, **kwargs)

    def on_step_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """Start of an optimizer step; resets the log/evaluate/save flags first."""
        control.should_log = False
        control.should_evaluate = False
        control.should_save = False
        return self.call_event("on_step_begin", args, state, control, **kwargs)

    def on_substep_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """End of a gradient-accumulation micro-step that is not the last of its step."""
        return self.call_event("on_substep_end", args, state, control, **kwargs)

    def on_pre_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """After gradient clipping, before ``optimizer.step()``."""
        return self.call_event("on_pre_optimizer_step", args, state, control, **kwargs)

    def on_optimizer_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """After ``optimizer.step()``, before gradients are zeroed."""
        return self.call_event("on_optimizer_step", args, state, control, **kwargs)

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """End of an optimizer step (``state.global_step`` already incremented)."""
        if kwargs:
            return self.call_event("on_step_end", args, state, control, **kwargs)
        # Every step, with the common keywords only: call_event's loop written out (no keyword merge, no forwarding).
        common = self._common
        if common is None:
            return self.call_event("on_step_end", args, state, control)
        for method in self._methods["on_step_end"]:
            result = method(args, state, control, **common)
            if isinstance(result, TrainerControl):
                control = result
        return control

    def on_evaluate(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, float], **kwargs: Any
    ) -> TrainerControl:
        """After an evaluation; resets ``should_evaluate`` first."""
        control.should_evaluate = False
        return self.call_event("on_evaluate", args, state, control, metrics=metrics, **kwargs)

    def on_predict(
        self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, float], **kwargs: Any
    ) -> TrainerControl:
        """After a successful ``Trainer.predict``."""
        return self.call_event("on_predict", args, state, control, metrics=metrics, **kwargs)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """After a checkpoint was saved; resets ``should_save`` first."""
        control.should_save = False
        return self.call_event("on_save", args, state, control, **kwargs)

    def on_log(
        self, args: Any, state: TrainerState, control: TrainerControl, logs: dict[str, Any], **kwargs: Any
    ) -> TrainerControl:
        """After logs were recorded in ``state.log_history``; resets ``should_log`` first."""
        control.should_log = False
        return self.call_event("on_log", args, state, control, logs=logs, **kwargs)

    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """After each evaluation/prediction batch."""
        return self.call_event("on_prediction_step", args, state, control, **kwargs)

    def on_push_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """Before pushing to a model hub."""
        return self.call_event("on_push_begin", args, state, control, **kwargs)


def _is_flow_callback(callback: Any) -> bool:
    """Whether ``callback`` is (a subclass of) DefaultFlowCallback, checked by name to avoid an import."""
    return any(cls.__name__ == "DefaultFlowCallback" for cls in type(callback).__mro__)


def _begin_step_quietly(args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
    """``on_step_begin`` when no callback listens: only the flag resets."""
    control.should_log = False
    control.should_evaluate = False
    control.should_save = False
    return control


def _pass_control(args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
    """A per-step event no callback listens to (the training loop skips the call when it finds this function)."""
    return control


QUIET_EVENT = _pass_control  # what ``handler.on_<event>`` is while no callback listens to that per-step event


# The events fired at every optimizer step (or micro-batch), and what each is while nobody listens to it.
_QUIET_STEP_EVENTS = {
    "on_step_begin": _begin_step_quietly,
    "on_substep_end": _pass_control,
    "on_pre_optimizer_step": _pass_control,
    "on_optimizer_step": _pass_control,
}


class _CallbackList(list):
    """The handler's callback list: changing it in place (``handler.callbacks.append(cb)``...) refreshes the
    handler's per-event dispatch, as ``add_callback`` does."""

    def __init__(self, handler: CallbackHandler, items: Any = ()) -> None:
        super().__init__(items)
        self._handler = handler

    def _changed(self) -> None:
        # Only for the list its handler holds (a copy or an unpickling fills the list before the handler is whole).
        handler = self.__dict__.get("_handler")
        if handler is not None and handler.__dict__.get("_callbacks") is self:
            handler._refresh()

    def append(self, item: Any) -> None:
        super().append(item)
        self._changed()

    def extend(self, items: Any) -> None:
        super().extend(items)
        self._changed()

    def insert(self, index: Any, item: Any) -> None:
        super().insert(index, item)
        self._changed()

    def remove(self, item: Any) -> None:
        super().remove(item)
        self._changed()

    def pop(self, index: Any = -1) -> Any:
        item = super().pop(index)
        self._changed()
        return item

    def clear(self) -> None:
        super().clear()
        self._changed()

    def sort(self, *args: Any, **kwargs: Any) -> None:
        super().sort(*args, **kwargs)
        self._changed()

    def reverse(self) -> None:
        super().reverse()
        self._changed()

    def __setitem__(self, index: Any, value: Any) -> None:
        super().__setitem__(index, value)
        self._changed()

    def __delitem__(self, index: Any) -> None:
        super().__delitem__(index)
        self._changed()

    # typeshed's overloads of list.__add__/__mul__ make every list subclass's __iadd__/__imul__ "incompatible"
    def __iadd__(self, items: Any) -> _CallbackList:  # type: ignore[misc]
        super().__iadd__(items)
        self._changed()
        return self

    def __imul__(self, times: Any) -> _CallbackList:  # type: ignore[misc]  # (as __iadd__)
        super().__imul__(times)
        self._changed()
        return self
