"""One optimizer step of a training run, as one object built once per ``train()`` call.

:class:`StepRunner` binds, when a run starts, everything a step calls (the Trainer's overridable ``training_step``,
the backend's synchronisation, clipping and stepping, the schedule), so that :meth:`StepRunner.step` reads as the
textbook step, top to bottom, with no per-step lookups and no copied fast path:

    [forward + backward (``training_step``, under ``no_sync`` but the last) -> on_substep_end]* -> clip
    -> on_pre_optimizer_step -> optimizer step -> on_optimizer_step -> schedule -> zero_grad

Disabled features cost nothing here: a window of one micro-batch gets its divisors from the window scaler without
counting, a backend without gradient synchronisation returns a null context, a scaler created disabled passes the
optimizer's step through, and an event nobody listens to is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Sequence

import torch

from ..args.data_options import tokens_seen_mode
from ..callbacks.events import QUIET_EVENT
from ..utils.overrides import accepts
from .loop_state import WINDOW_SETTLE_EVERY, LoopState
from .loss_scaling import WindowScaler

if TYPE_CHECKING:
    from torch import nn

    from ..args.fields import TrainingArguments
    from ..backends.base import Backend
    from .contract import TrainLoopTrainer

__all__ = ["StepRunner", "clip_norm_of"]


def clip_norm_of(args: TrainingArguments, backend: Backend) -> float | None:
    """The norm the step clips gradients to (None: no clipping, or the engine clips inside its own step)."""
    if args.max_grad_norm is None or args.max_grad_norm <= 0 or backend.caps.handles_grad_accumulation:
        return None
    return args.max_grad_norm


def training_step_takes_num_items(trainer: TrainLoopTrainer) -> bool:
    """Whether ``trainer.training_step`` (maybe an override of upstream's older ``training_step(model, inputs)``)
    takes ``num_items_in_batch``."""
    positional = accepts(trainer, "training_step").positional
    return positional is None or positional >= 3


class StepRunner:
    """Runs the optimizer steps of one training run; see the module docstring for the order of one step.

    ``trainer`` is read for its overridable methods and its callback handler (whose events are looked up per step:
    a callback may add callbacks); ``loop`` receives the losses, tokens, the rate each step used and the skipped
    steps; ``model`` is what the forward passes call (the backend's wrapped model); ``floating_point_ops`` and
    ``count_input_tokens`` count each micro-batch's FLOPs and tokens (the run's parts); ``scaler`` normalises each
    accumulation window (decided from the run's first batch).
    """

    def __init__(self, trainer: TrainLoopTrainer, loop: LoopState, model: nn.Module, scaler: WindowScaler,
                 *, scheduler_per_step: bool, floating_point_ops: Callable[[Any], int],
                 count_input_tokens: Callable[..., int]) -> None:
        args, backend = trainer.args, trainer.backend
        self.trainer, self.loop, self.model, self.scaler = trainer, loop, model, scaler
        self.args, self.state, self.callbacks = args, trainer.state, trainer.callback_handler
        self.training_step = trainer.training_step
        self.step_takes_num_items = training_step_takes_num_items(trainer)
        self.floating_point_ops = floating_point_ops
        self.count_input_tokens = count_input_tokens
        self.tokens_seen = tokens_seen_mode(args.include_num_input_tokens_seen)  # "all", "non_padding" or "no"
        self.count_tokens = self.tokens_seen != "no" or bool(args.include_tokens_per_second)
        self.no_sync = backend.no_sync
        self.clip_norm = clip_norm_of(args, backend)
        self.clip_grad_norm = backend.clip_grad_norm
        self.optimizer_step = backend.optimizer_step
        # an engine that clips inside its own step (DeepSpeed) reports the norm after it; otherwise the clip's
        self.engine_grad_norm = backend.last_grad_norm if backend.caps.handles_grad_accumulation else None
        self.zero_grad = backend.zero_grad
        self.scheduler = trainer.lr_scheduler if scheduler_per_step else None  # ReduceLROnPlateau: on metrics

    def step(self, group: Sequence[Any]) -> torch.Tensor | None:
        """One optimizer step over the micro-batches of ``group``; returns the gradient norm before clipping (None
        when nothing measured it)."""
        trainer, args, state, callbacks = self.trainer, self.args, self.state, self.callbacks
        num_items, divisors = self.scaler.window(group)
        last = len(group) - 1
        self.loop.window_size = last + 1
        for i, inputs in enumerate(group):
            with self.no_sync(i == last):  # gradients are synchronised once, on the window's last backward
                self.forward_backward(inputs, num_items, divisors[i])
            if i != last:
                trainer.control = callbacks.on_substep_end(args, state, trainer.control)
        grad_norm = self.clip_grad_norm(self.clip_norm) if self.clip_norm is not None else None
        event = callbacks.on_pre_optimizer_step
        if event is not QUIET_EVENT:
            trainer.control = event(args, state, trainer.control)
        stepped = self.optimizer_step()  # False: an fp16 step skipped on overflow
        if self.engine_grad_norm is not None:
            grad_norm = self.engine_grad_norm()
        event = callbacks.on_optimizer_step
        if event is not QUIET_EVENT:
            trainer.control = event(args, state, trainer.control)
        # the rate this step used (logged, and handed to _maybe_log_save_evaluate as upstream's loop does)
        if stepped and self.scheduler is not None:
            self.loop.step_learning_rate = float(self.scheduler.get_last_lr()[0])
            self.scheduler.step()
        else:  # the rate did not move (a skipped step, a schedule stepped on metrics): read as upstream reads it
            self.loop.step_learning_rate = trainer._get_learning_rate()
            self.loop.skipped_steps += not stepped
        self.zero_grad()
        return grad_norm

    def forward_backward(self, inputs: Any, num_items: Any, divisor: Any) -> None:
        """Forward and backward of one micro-batch through ``training_step``, then its loss, tokens and FLOPs."""
        loop = self.loop
        if self.count_tokens:
            tokens = self.count_input_tokens(inputs)
            loop.tokens_trained += tokens
            if self.tokens_seen == "all":
                self.state.num_input_tokens_seen += tokens
            elif self.tokens_seen == "non_padding":
                self.state.num_input_tokens_seen += self.count_input_tokens(inputs, non_padding=True)
        loop.accumulation_divisor = divisor  # the Trainer's current_gradient_accumulation_steps
        if self.step_takes_num_items:
            step_loss = self.training_step(self.model, inputs, num_items)
        else:  # an override written for upstream's older training_step(model, inputs)
            step_loss = self.training_step(self.model, inputs)
        loop.tr_loss.add_(step_loss)  # in place: the accumulator is the one tensor the logs read
        window_losses = loop.window_losses
        if window_losses is not None:  # logging_nan_inf_filter: kept to filter a nan/inf at log time
            window_losses.append((self.state.global_step, step_loss))
            if len(window_losses) >= WINDOW_SETTLE_EVERY:
                loop.settle()
        loop.flos += float(self.floating_point_ops(inputs))  # the Trainer's current_flos
