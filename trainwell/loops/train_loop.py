"""The training loop: epochs, micro-batches, gradient accumulation and optimizer steps.

The loop is written against the Trainer's public (overridable) methods (``training_step``, ``_maybe_log_save_evaluate``,
...) and the backend interface; it never asks which backend it runs on. One optimizer step is, in order:

    on_step_begin -> [training_step (forward+backward) -> on_substep_end]* -> clip -> on_pre_optimizer_step
    -> optimizer step -> on_optimizer_step -> scheduler step -> zero_grad -> on_step_end -> log / evaluate / save

where everything between the two step events is :meth:`~trainwell.loops.step.StepRunner.step`, and the batches come
one ahead of the step (:mod:`trainwell.loops.look_ahead`).

What the loop owns (the data position, the running losses) is one :class:`LoopState`, passed to the functions here
and kept on the trainer as ``trainer._tw_loop`` for logging, checkpoints and the final metrics.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import torch

from ..data.loader import collator_draws_randomness, has_length
from ..utils.trainer_utils import TrainOutput
from .look_ahead import BatchLookAhead
from .loop_state import DataPosition, LoopState, TrainPlan
from .loss_scaling import loss_divisors
from .step import StepRunner

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
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


def _start_run(trainer: TrainLoopTrainer, resume_from: Any) -> tuple[Any, TrainPlan, Any, LoopState]:
    """The run's dataloader, plan, prepared model and loop state (restored from ``resume_from`` when given)."""
    args = trainer.args
    batch_size = trainer._train_batch_size or args.train_batch_size
    dataloader = trainer.get_train_dataloader()
    plan = plan_training(args, dataloader, args.world_size, batch_size)
    trainer._init_state(plan)
    model = trainer._prepare_for_training(plan.max_steps)
    train_mode = getattr(trainer.optimizer, "train", None)
    if callable(train_mode):  # schedule-free optimizers: train mode, as upstream
        train_mode()
    position = trainer._resume(resume_from) if resume_from is not None else DataPosition()
    loop = LoopState.start(position, device=args.device, nan_inf_filter=args.logging_nan_inf_filter,
                           accumulation_steps=args.gradient_accumulation_steps, rank=args.process_index,
                           world_size=args.world_size)
    trainer._tw_loop = loop
    if resume_from is not None:
        loop.resumed_next_batch_rng = trainer._tw_checkpoints.resumed_next_batch_rng
    loop.steps_at_start = trainer.state.global_step  # the speed counts the steps this call runs (resumed: from here)
    position.batches_per_epoch, position.train_batch_size = plan.micro_batches_per_epoch, batch_size
    trainer.callback_handler.train_dataloader = dataloader
    return dataloader, plan, model, loop


def run_training(trainer: TrainLoopTrainer, *, resume_from: Any = None, trial: Any = None,
                 ignore_keys_for_eval: list[str] | None = None) -> TrainOutput:
    """Train ``trainer.model`` to the end of the plan; returns :class:`TrainOutput`.

    Epochs of accumulation groups; each group is one optimizer step (:meth:`StepRunner.step`) between
    ``on_step_begin`` and ``on_step_end``, then logging, evaluation and saving as the arguments ask.
    """
    dataloader, plan, model, loop = _start_run(trainer, resume_from)
    args, state, cb = trainer.args, trainer.state, trainer.callback_handler
    position, tr_loss = loop.position, loop.tr_loss
    look_ahead = BatchLookAhead(collator_draws_randomness(dataloader))
    log_save_evaluate, stop_if_preempted = trainer._maybe_log_save_evaluate, trainer._tw_checkpoints.stop_if_preempted
    runner: StepRunner | None = None  # built on the run's first batch (which decides how windows are normalised)
    start_time = time.time()
    trainer.control = cb.on_train_begin(args, state, trainer.control)
    if args.eval_on_start and resume_from is None:
        trainer._evaluate(trial, ignore_keys_for_eval)
    grad_norm = None
    skip = 0 if args.ignore_data_skip else position.batches_in_epoch
    for epoch in range(position.epoch, plan.num_epochs):
        position.epoch, position.batches_in_epoch = epoch, skip
        iterator = _epoch_iterator(trainer, dataloader, epoch, skip)
        iterator = look_ahead.batches(iterator, loop, loop.resumed_next_batch_rng if skip else None)
        skip = 0
        model.train()
        if args.past_index >= 0:
            trainer._past = None  # the memory of past_index models does not run across epochs (as upstream)
        trainer.control = cb.on_epoch_begin(args, state, trainer.control)
        groups = _accumulation_groups(iterator, args.gradient_accumulation_steps)
        first = next(groups, None)
        if first is not None:  # (none: an epoch without batches left, e.g. a run resumed at its end)
            runner = runner or StepRunner(trainer, loop, model, trainer._window_scaler(first[0]),
                                          scheduler_per_step=not trainer._scheduler_needs_metrics())
            for group in itertools.chain((first,), groups):
                trainer.control = cb.on_step_begin(args, state, trainer.control)
                grad_norm = runner.step(group)
                position.batches_in_epoch += len(group)
                state.global_step += 1
                state.epoch = epoch + (position.batches_in_epoch / plan.micro_batches_per_epoch
                                       if plan.micro_batches_per_epoch else 0.0)
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
