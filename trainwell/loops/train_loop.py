"""The training loop: epochs, micro-batches, gradient accumulation and optimizer steps.

The loop is written against the Trainer's public (overridable) methods (``training_step``, ``_maybe_log_save_evaluate``,
...) and the backend interface; it never asks which backend it runs on. One optimizer step is, in order:

    on_step_begin -> [training_step (forward+backward) -> on_substep_end]* -> clip -> on_pre_optimizer_step
    -> optimizer step -> on_optimizer_step -> scheduler step -> zero_grad -> on_step_end -> log / evaluate / save

What the loop owns (the data position, the running losses) is one :class:`LoopState`, passed to the functions here
and kept on the trainer as ``trainer._tw_loop`` for logging, checkpoints and the final metrics.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from ..callbacks.events import QUIET_EVENT
from ..data.loader import collates_with_randomness, has_length
from ..utils.overrides import accepts
from ..utils.trainer_utils import TrainOutput
from .loop_state import WINDOW_SETTLE_EVERY, DataPosition, LoopState, TrainPlan
from .loss_scaling import WindowScaler, loss_divisors

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
    from ..backends.base import Backend
    from .contract import TrainLoopTrainer

__all__ = ["DataPosition", "LoopState", "TrainPlan", "loss_divisors", "plan_training", "run_training"]


def plan_training(args: TrainingArguments, dataloader: Any, world_size: int, batch_size: int | None = None) -> TrainPlan:
    """Steps and epochs from ``num_train_epochs`` (fractional allowed) or ``max_steps``.

    ``batch_size`` is the per-process batch size in use (``args.train_batch_size`` unless ``auto_find_batch_size``
    lowered it).
    """
    ga = args.gradient_accumulation_steps
    batch_size = batch_size or args.train_batch_size
    total_batch = batch_size * ga * world_size
    if has_length(dataloader):
        micro = len(dataloader)
        updates = max(math.ceil(micro / ga), 1)
        if args.max_steps > 0:
            max_steps = args.max_steps
            epochs = math.ceil(max_steps / updates)
        else:
            max_steps = math.ceil(args.num_train_epochs * updates)
            epochs = math.ceil(args.num_train_epochs)
        examples = len(dataloader.dataset) if has_length(dataloader.dataset) else micro * batch_size
        return TrainPlan(micro, updates, max_steps, epochs, examples, total_batch)
    if args.max_steps <= 0:
        raise ValueError(
            "The training dataset has no length (an IterableDataset), so num_train_epochs cannot be turned into a "
            "number of steps: set max_steps=N in TrainingArguments"
        )
    return TrainPlan(None, None, args.max_steps, sys.maxsize, args.max_steps * total_batch, total_batch)


def _accumulation_groups(iterator: Iterator[Any], ga: int) -> Iterator[Sequence[Any]]:
    """The micro-batches of each optimizer step (the last group of an epoch may be shorter)."""
    if ga == 1:  # one micro-batch per step (the default): 1-tuples made in C, no generator to resume
        return zip(iterator)
    return _filled_groups(iterator, ga)


def _filled_groups(iterator: Iterator[Any], ga: int) -> Iterator[list[Any]]:
    while True:
        group = []
        for batch in iterator:
            group.append(batch)
            if len(group) == ga:
                break
        if not group:
            return
        yield group


def _epoch_iterator(trainer: TrainLoopTrainer, dataloader: Any, epoch: int, skip_batches: int) -> Iterator[Any]:
    """The epoch's batches, starting ``skip_batches`` in: by seeking the sampler when it can, else by discarding."""
    sampler = getattr(dataloader, "sampler", None)
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    # as accelerate does: a batch sampler with its own epoch-seeded shuffle (sentence-transformers') is told too
    for obj in (sampler, batch_sampler, inner, getattr(dataloader, "dataset", None)):
        if obj is not None and hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
    # An iterable dataset may shuffle with its own generator: seeded as a function of the epoch, so every epoch
    # differs and a resumed run redraws the same numbers.
    generator = getattr(dataloader.dataset, "generator", None)
    if isinstance(generator, torch.Generator):
        generator.manual_seed(trainer.args.seed + epoch)
    if skip_batches <= 0:
        return iter(dataloader)  # draws the workers' base seed from the global stream, as upstream's loader does
    # A resumed epoch: the uninterrupted run drew the base seed before the checkpoint's RNG state was saved, so this
    # pass must not draw again (the restored stream would shift by one number and change every dropout mask).
    with torch.random.fork_rng(devices=[]):
        seekable = inner if inner is not None and hasattr(inner, "skip") else None
        if seekable is not None and batch_sampler is not None:
            seekable.skip(skip_batches * batch_sampler.batch_size)
            return iter(dataloader)
        from ..checkpoint.rng import capture_rng_state, restore_rng_state

        # Read and dropped now, every random state kept: the uninterrupted run collated these batches before the
        # checkpoint's states were saved.
        states = capture_rng_state()
        iterator = iter(dataloader)
        for _ in itertools.islice(iterator, skip_batches):
            pass
        restore_rng_state(states)
        return iterator


def _one_batch_ahead(iterator: Iterator[Any], loop: LoopState, snapshot: bool,
                     first_rng: dict[str, Any] | None = None) -> Iterator[Any]:
    """``iterator``'s batches, each yielded once the next one was fetched, as accelerate's loader (upstream's) does:
    a collator drawing from the global random streams (MLM masking) draws in upstream's order, interleaved one batch
    ahead of the forward passes' draws (dropout).

    ``snapshot``: keep in ``loop.next_batch_rng`` the random states from just before the pending batch was fetched,
    which a checkpoint saves; ``first_rng``: those states from the checkpoint this run resumes (the first batch is
    fetched from them, then the stream continues where the checkpoint left it).
    """
    if first_rng is not None:
        from ..checkpoint.rng import capture_rng_state, restore_rng_state

        resumed = capture_rng_state()
        restore_rng_state(first_rng)
        current = next(iterator, _END)
        restore_rng_state(resumed)
    else:
        current = next(iterator, _END)
    capture = None
    if snapshot:
        from ..checkpoint.rng import capture_rng_state as capture
    while current is not _END:
        if capture is not None:
            loop.next_batch_rng = capture()
        pending = next(iterator, _END)
        yield current
        current = pending
    loop.next_batch_rng = None


_END = object()


def _micro_batch_runner(trainer: TrainLoopTrainer, loop: LoopState, model: Any,
                        count_tokens: bool) -> Callable[..., None]:
    """The function running one micro-batch ``(inputs, num_items_in_batch, divisor)``: forward and backward through
    ``trainer.training_step``, then the loss, token and FLOP bookkeeping in ``loop`` and on the trainer.

    Built once per run: what it reads (the bound methods, the run's flags, the loss accumulators) is looked up here,
    not at every micro-batch.
    """
    state = trainer.state
    training_step, floating_point_ops = trainer.training_step, trainer._flops_counter()
    takes_items = loop.step_takes_num_items
    tr_loss, window_losses = loop.tr_loss, loop.window_losses
    tokens_seen = bool(trainer.args.include_num_input_tokens_seen)

    def run(inputs: Any, num_items: Any, divisor: Any) -> None:
        if count_tokens:
            tokens = trainer._count_input_tokens(inputs)
            loop.tokens_trained += tokens
            if tokens_seen:
                state.num_input_tokens_seen += tokens
        trainer.current_gradient_accumulation_steps = divisor
        if takes_items:
            step_loss = training_step(model, inputs, num_items)
        else:  # an override written for upstream's older training_step(model, inputs)
            step_loss = training_step(model, inputs)
        tr_loss.add_(step_loss)  # in place, as ``+=``: the accumulator is the one object the logs read
        if window_losses is not None:  # logging_nan_inf_filter: kept to filter a nan/inf at log time (no tensor op)
            window_losses.append((state.global_step, step_loss))
            if len(window_losses) >= WINDOW_SETTLE_EVERY:
                loop.settle()
        trainer.current_flos += float(floating_point_ops(inputs))

    return run


def _forward_backward(trainer: TrainLoopTrainer, micro_batch: Callable[..., None], group: Sequence[Any],
                      scaler: WindowScaler, plain_single: bool) -> None:
    """Forward and backward over the micro-batches of one optimizer step (``micro_batch`` from
    :func:`_micro_batch_runner`).

    ``plain_single``: a window of one micro-batch needs neither counting (the model's own mean, divided by 1) nor a
    synchronisation context (the backend's ``no_sync(True)`` is a no-op), read once per run.
    """
    if plain_single and len(group) == 1:
        micro_batch(group[0], None, 1)
        return
    num_items, divisors = scaler.window(group)
    args, state, cb, backend = trainer.args, trainer.state, trainer.callback_handler, trainer.backend
    last = len(group) - 1
    for i, inputs in enumerate(group):
        with backend.no_sync(i == last):
            micro_batch(inputs, num_items, divisors[i])
        if i != last:
            trainer.control = cb.on_substep_end(args, state, trainer.control)


def _training_step_takes_num_items(trainer: TrainLoopTrainer) -> bool:
    """Whether ``trainer.training_step`` (maybe an override of an older upstream signature) takes
    ``num_items_in_batch``; read once per run, so each micro-batch calls it directly."""
    positional = accepts(trainer, "training_step").positional
    return positional is None or positional >= 3


def _clip_norm(args: TrainingArguments, backend: Backend) -> float | None:
    """The norm the loop clips gradients to (None: no clipping, or the engine clips inside its step)."""
    if args.max_grad_norm is None or args.max_grad_norm <= 0 or backend.caps.handles_grad_accumulation:
        return None
    return args.max_grad_norm


def _optimizer_updater(trainer: TrainLoopTrainer, clip_norm: float | None, scheduler_per_step: bool,
                       engine_clips: bool = False) -> Callable[[], torch.Tensor | None]:
    """The function that ends an optimizer step: clip, step the optimizer and the schedule, drop the gradients; it
    returns the gradient norm (None unclipped). Built once per run, with the backend's and the schedule's methods
    bound.

    ``engine_clips``: the backend's engine clipped inside its step (``caps.handles_grad_accumulation``); its norm is
    asked for after the step.
    """
    args, state, cb, backend = trainer.args, trainer.state, trainer.callback_handler, trainer.backend
    clip, optimizer_step, zero_grad = backend.clip_grad_norm, backend.optimizer_step, backend.zero_grad
    scheduler = trainer.lr_scheduler if scheduler_per_step else None
    get_last_lr, schedule_step = (scheduler.get_last_lr, scheduler.step) if scheduler is not None else (None, None)

    def update() -> torch.Tensor | None:
        grad_norm = clip(clip_norm) if clip_norm is not None else None
        event = cb.on_pre_optimizer_step  # read per step (a callback may add callbacks); skipped while nobody listens
        if event is not QUIET_EVENT:
            trainer.control = event(args, state, trainer.control)
        stepped = optimizer_step()
        if engine_clips:
            grad_norm = backend.last_grad_norm()
        event = cb.on_optimizer_step
        if event is not QUIET_EVENT:
            trainer.control = event(args, state, trainer.control)
        if stepped and get_last_lr is not None:
            trainer._tw_step_learning_rate = get_last_lr()[0]  # what the step used: logged (upstream)
            schedule_step()
        else:  # the rate did not move: the logs read it as it is
            trainer._tw_step_learning_rate = None
            if not stepped:
                trainer._tw_skipped_steps += 1
        zero_grad()
        return grad_norm

    return update


def _single_batch_is_plain(scaler: WindowScaler, backend: Backend) -> bool:
    """Whether a window of one micro-batch runs as it is: no items to count (the model's own mean, divided by 1) and
    nothing for the backend to do around it (its ``no_sync(True)`` is a no-op context)."""
    return scaler.single_batch_is_plain() and isinstance(backend.no_sync(True), contextlib.nullcontext)


def _start_run(trainer: TrainLoopTrainer, resume_from: Any) -> tuple[Any, TrainPlan, Any, LoopState]:
    """The run's dataloader, plan, prepared model and loop state (restored from ``resume_from`` when given)."""
    args = trainer.args
    batch_size = trainer._train_batch_size or args.train_batch_size
    dataloader = trainer.get_train_dataloader()
    plan = plan_training(args, dataloader, args.world_size, batch_size)
    trainer._init_state(plan)
    model = trainer._prepare_for_training(plan.max_steps)
    if callable(getattr(trainer.optimizer, "train", None)):  # schedule-free optimizers: train mode, as upstream
        trainer.optimizer.train()
    position = trainer._resume(resume_from) if resume_from is not None else DataPosition()
    loop = LoopState.start(position, device=args.device, nan_inf_filter=args.logging_nan_inf_filter,
                           accumulation_steps=args.gradient_accumulation_steps, rank=args.process_index,
                           world_size=args.world_size)
    trainer._tw_loop = loop
    if resume_from is not None:
        loop.resumed_next_batch_rng = trainer._tw_checkpoints.resumed_next_batch_rng
    loop.step_takes_num_items = _training_step_takes_num_items(trainer)
    loop.steps_at_start = trainer.state.global_step  # the speed counts the steps this call runs (resumed: from here)
    position.batches_per_epoch, position.train_batch_size = plan.micro_batches_per_epoch, batch_size
    trainer.callback_handler.train_dataloader = dataloader
    return dataloader, plan, model, loop


def run_training(trainer: TrainLoopTrainer, *, resume_from: Any = None, trial: Any = None,
                 ignore_keys_for_eval: list[str] | None = None) -> TrainOutput:
    """Train ``trainer.model`` to the end of the plan; returns :class:`TrainOutput`."""
    dataloader, plan, model, loop = _start_run(trainer, resume_from)
    args, state, cb = trainer.args, trainer.state, trainer.callback_handler
    position, tr_loss = loop.position, loop.tr_loss
    scaler = None  # how windows are normalised: decided on the first micro-batch (a probe forward, once)
    trainer._tw_step_learning_rate = None
    count_tokens = bool(args.include_num_input_tokens_seen or args.include_tokens_per_second)
    scheduler_per_step = not trainer._scheduler_needs_metrics()
    clip_norm = _clip_norm(args, trainer.backend)
    engine_clips = trainer.backend.caps.handles_grad_accumulation
    batches_per_epoch = plan.micro_batches_per_epoch
    start_time = time.time()
    trainer.control = cb.on_train_begin(args, state, trainer.control)
    if args.eval_on_start and resume_from is None:
        trainer._evaluate(trial, ignore_keys_for_eval)
    grad_norm = None
    # Bound once per run (the schedule and the backend are settled by now); the callback events are read per step
    # (a callback may add or remove callbacks during training).
    micro_batch = _micro_batch_runner(trainer, loop, model, count_tokens)
    update = _optimizer_updater(trainer, clip_norm, scheduler_per_step, engine_clips)
    log_save_evaluate, stop_if_preempted = trainer._maybe_log_save_evaluate, trainer._tw_checkpoints.stop_if_preempted
    plain_single = False
    snapshot = collates_with_randomness(dataloader)  # a checkpoint then keeps the states the next batch needs
    skip = 0 if args.ignore_data_skip else position.batches_in_epoch
    for epoch in range(position.epoch, plan.num_epochs):
        position.epoch, position.batches_in_epoch = epoch, skip
        iterator = _epoch_iterator(trainer, dataloader, epoch, skip)
        iterator = _one_batch_ahead(iterator, loop, snapshot, loop.resumed_next_batch_rng if skip else None)
        skip = 0
        model.train()
        if args.past_index >= 0:
            trainer._past = None  # the memory of past_index models does not run across epochs (as upstream)
        trainer.control = cb.on_epoch_begin(args, state, trainer.control)
        for group in _accumulation_groups(iterator, args.gradient_accumulation_steps):
            if scaler is None:
                scaler = trainer._window_scaler(group[0])
                plain_single = _single_batch_is_plain(scaler, trainer.backend)
            trainer.control = cb.on_step_begin(args, state, trainer.control)  # per step: callbacks may change
            if plain_single and len(group) == 1:  # _forward_backward's first case, without the call
                micro_batch(group[0], None, 1)
            else:
                _forward_backward(trainer, micro_batch, group, scaler, plain_single)
            position.batches_in_epoch += len(group)
            grad_norm = update()
            state.global_step += 1
            state.epoch = epoch + (position.batches_in_epoch / batches_per_epoch if batches_per_epoch else 0.0)
            trainer.control = cb.on_step_end(args, state, trainer.control)
            log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time)
            if stop_if_preempted(model, trial, tr_loss):
                break
            if trainer.control.should_epoch_stop or trainer.control.should_training_stop:
                break
        if trainer.preempted:  # SIGTERM/SIGINT: checkpoint saved mid-epoch; the epoch is not over
            break
        if plan.micro_batches_per_epoch is None:
            state.epoch = float(epoch + 1)
        # From here on a checkpoint belongs to the next epoch (an epoch-strategy save resumes at its start).
        position.epoch, position.batches_in_epoch = epoch + 1, 0
        trainer.control = cb.on_epoch_end(args, state, trainer.control)
        trainer._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time)
        if trainer.control.should_training_stop or state.global_step >= plan.max_steps:
            break
    return trainer._finish_training(tr_loss, plan, start_time)
