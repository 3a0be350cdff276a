"""The training loop: epochs, micro-batches, gradient accumulation and optimizer steps.

The loop is written against the Trainer's public (overridable) methods (``training_step``, ``_maybe_log_save_evaluate``,
...) and the backend interface; it never asks which backend it runs on. One optimizer step is, in order:

    on_step_begin -> [training_step (forward+backward) -> on_substep_end]* -> clip -> on_pre_optimizer_step
    -> optimizer step -> on_optimizer_step -> scheduler step -> zero_grad -> on_step_end -> log / evaluate / save

where everything between the two step events is :meth:`~trainwell.loops.step.StepRunner.step`, and the batches come
one ahead of the step (the run's :class:`~trainwell.loops.look_ahead.BatchLookAhead`).

The run (:class:`~trainwell.loops.run.TrainingRun`, built by ``Trainer.train()``) holds what the loop trains with;
what the loop owns (the data position, the running losses) is its :class:`LoopState` (``run.loop``), read by the
logs, the checkpoints and the final metrics.
"""

from __future__ import annotations

import itertools
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import torch

from .loop_state import DataPosition, LoopState, TrainPlan, plan_training
from .loss_scaling import loss_divisors
from .step import StepRunner
from ..checkpoint.rng import capture_rng_state, restore_rng_state
from ..data.stream_state import StreamPosition
from ..utils.overrides import accepts

if TYPE_CHECKING:
    from .contract import TrainLoopTrainer
    from .run import TrainingRun

__all__ = ["DataPosition", "LoopState", "TrainPlan", "loss_divisors", "plan_training", "run_training"]


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


def _epoch_iterator(seed: int, dataloader: Any, epoch: int, skip_batches: int, *,
                    stream: StreamPosition | None = None, progress: bool = False) -> Iterator[Any]:
    """The epoch's batches, starting ``skip_batches`` in: by seeking the sampler when it can, by restoring the
    stream's saved position (``stream``, :mod:`trainwell.data.stream_state`) when it has one, else by discarding
    (logged with the count; a progress bar too with ``progress``)."""
    sampler = getattr(dataloader, "sampler", None)
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None)
    # a batch sampler split across processes (accelerate's BatchSamplerShard) wraps the one that shuffles
    wrapped = getattr(batch_sampler, "batch_sampler", None)
    # as accelerate does: a batch sampler with its own epoch-seeded shuffle (sentence-transformers') is told too
    for obj in (sampler, batch_sampler, inner, wrapped, getattr(wrapped, "sampler", None),
                getattr(dataloader, "dataset", None)):
        if obj is not None and hasattr(obj, "set_epoch"):
            obj.set_epoch(epoch)
    # An iterable dataset may shuffle with its own generator: seeded as a function of the epoch, so every epoch
    # differs and a resumed run redraws the same numbers.
    generator = getattr(getattr(dataloader, "dataset", None), "generator", None)
    if isinstance(generator, torch.Generator):
        generator.manual_seed(seed + epoch)
    if skip_batches <= 0:
        return iter(dataloader)  # draws the workers' base seed from the global stream, as upstream's loader does
    # A resumed epoch: the uninterrupted run drew the base seed before the checkpoint's RNG state was saved, so this
    # pass must not draw again (the restored stream would shift by one number and change every dropout mask).
    with torch.random.fork_rng(devices=[]):
        seekable = inner if inner is not None and hasattr(inner, "skip") else None
        if seekable is not None and batch_sampler is not None:
            seekable.skip(skip_batches * batch_sampler.batch_size)
            return iter(dataloader)
        if stream is not None and stream.restore(skip_batches):
            resume_count = getattr(getattr(dataloader, "dataset", None), "resume_count", None)
            if resume_count is not None and getattr(dataloader, "batch_size", None):
                resume_count(skip_batches * dataloader.batch_size)  # the length check counts on from there
            return iter(dataloader)

        # Read and dropped now, every random state kept: the uninterrupted run collated these batches before the
        # checkpoint's states were saved.
        states = capture_rng_state()
        iterator = iter(dataloader)
        for _ in _rereading(itertools.islice(iterator, skip_batches), skip_batches, progress):
            pass
        restore_rng_state(states)
        return iterator


def _rereading(batches: Iterator[Any], count: int, progress: bool) -> Iterator[Any]:
    """``batches`` (the ``count`` re-read to reach a resumed position), behind a tqdm bar with ``progress``."""
    if not progress:
        return batches
    from tqdm.auto import tqdm

    return iter(tqdm(batches, total=count, desc="Re-reading the consumed batches", leave=False))


def _log_save_evaluate_of(trainer: TrainLoopTrainer) -> Callable[..., None]:
    """The Trainer's ``_maybe_log_save_evaluate``, called as upstream's loop calls it (``learning_rate=``, the rate
    the step used, which an override such as TRL's OnlineDPOTrainer's logs); an override written before upstream
    handed the rate on (no ``learning_rate`` parameter) is called without it."""
    method = trainer._maybe_log_save_evaluate
    if accepts(trainer, "_maybe_log_save_evaluate").takes("learning_rate"):
        return method

    def without_rate(*args: Any, learning_rate: float | None = None) -> None:
        method(*args)

    return without_rate


def run_training(run: TrainingRun) -> TrainingRun:
    """Train ``run`` to the end of its plan (or a stop); returns it for :func:`~trainwell.loops.run.finish`.

    Epochs of accumulation groups; each group is one optimizer step (:meth:`StepRunner.step`) between
    ``on_step_begin`` and ``on_step_end``, then logging, evaluation and saving as the arguments ask.
    """
    trainer, args, plan, loop, model = run.trainer, run.args, run.plan, run.loop, run.wrapped
    state, cb, trial, ignore_keys_for_eval = run.state, run.callbacks, run.trial, run.ignore_keys_for_eval
    position, tr_loss = loop.position, loop.tr_loss
    log_save_evaluate, stop_if_preempted = _log_save_evaluate_of(trainer), run.checkpoints.stop_if_preempted
    runner: StepRunner | None = None  # built on the run's first batch (which decides how windows are normalised)
    run.start_time = start_time = time.time()
    trainer.control = cb.on_train_begin(args, state, trainer.control)
    if args.eval_on_start and run.resumed_from is None:
        trainer._evaluate(trial, ignore_keys_for_eval)
    grad_norm = None
    skip = 0 if args.ignore_data_skip else position.batches_in_epoch
    for epoch in range(position.epoch, plan.num_epochs):
        position.epoch, position.batches_in_epoch = epoch, skip
        iterator = _epoch_iterator(args.seed, run.dataloader, epoch, skip, stream=run.stream,
                                   progress=not args.disable_tqdm and run.trainer.is_local_process_zero())
        iterator = run.look_ahead.batches(iterator, resuming=skip > 0)
        skip = 0
        model.train()
        if args.past_index >= 0:
            trainer._past = None  # the memory of past_index models does not run across epochs (as upstream)
        trainer.control = cb.on_epoch_begin(args, state, trainer.control)
        groups = _accumulation_groups(iterator, args.gradient_accumulation_steps)
        first = next(groups, None)
        if first is not None:  # (none: an epoch without batches left, e.g. a run resumed at its end)
            runner = runner or StepRunner(trainer, loop, model, run.window_scaler(first[0]),
                                          scheduler_per_step=not run.parts.scheduler_needs_metrics(),
                                          floating_point_ops=run.parts.flops_counter(),
                                          count_input_tokens=run.parts.count_input_tokens)
            for group in itertools.chain((first,), groups):
                trainer.control = cb.on_step_begin(args, state, trainer.control)
                grad_norm = runner.step(group)
                position.batches_in_epoch += len(group)
                state.global_step += 1
                state.epoch = epoch + (position.batches_in_epoch / plan.micro_batches_per_epoch
                                       if plan.micro_batches_per_epoch else 0.0)
                trainer.control = cb.on_step_end(args, state, trainer.control)
                log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                  learning_rate=loop.step_learning_rate)  # the rate the step used, as upstream
                if stop_if_preempted(model, trial, tr_loss):
                    break
                if trainer.control.should_epoch_stop or trainer.control.should_training_stop:
                    break
        if run.checkpoints.preempted:  # SIGTERM/SIGINT: checkpoint saved mid-epoch; the epoch is not over
            break
        if plan.micro_batches_per_epoch is None:
            state.epoch = float(epoch + 1)
        # From here on a checkpoint belongs to the next epoch (an epoch-strategy save resumes at its start).
        position.epoch, position.batches_in_epoch = epoch + 1, 0
        trainer.control = cb.on_epoch_end(args, state, trainer.control)
        log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                          learning_rate=loop.step_learning_rate)
        if trainer.control.should_training_stop or state.global_step >= plan.max_steps:
            break
    return run
