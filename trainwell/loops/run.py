"""One ``train()`` call as one object: :class:`TrainingRun`, and the run's bookkeeping as functions of it.

``Trainer.train()`` builds a :class:`TrainingRun` and hands it to :func:`~trainwell.loops.train_loop.run_training`.
The constructor does, in order, what upstream's ``_inner_training_loop`` does before its first step: the dataloader
and the plan, a fresh ``TrainerState``, the model prepared (activation checkpointing, the backend's wrapping, the
training hooks, the optimizer and schedule, ``torch.compile``), the checkpoint resumed, the loop's state. It is the
one place outside ``trainer/trainer.py`` that assigns Trainer attributes, and only upstream's public ones that a
run replaces (``state``, ``model``, ``model_wrapped``, ``optimizer``, ``lr_scheduler``, ``_train_batch_size``), so
that callbacks, overrides and user code read this run's objects where upstream has them.

The functions below (the logging window, the best metric, the loss-scaling decision, the end of training) read the
run and call the Trainer's overridable methods (``log``, ``store_flos``, ``_load_best_model``,
``_rotate_checkpoints``...) where upstream calls them, so that an override is reached.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..utils.trainer_state import TrainerControl, TrainerState
from ..data.loader import collator_draws_randomness
from ..utils import reporting
from ..utils.losses import all_labels_ignored
from ..utils.model_utils import accepts_loss_kwargs, activation_checkpointing, compile_model
from ..utils.model_utils import enable_gradient_checkpointing, is_causal_lm, unwrap_model
from ..utils.overrides import call_override
from ..utils.option_enums import SaveStrategy
from ..utils.outputs import TrainOutput
from .best_metric import MissingMetricError
from . import train_hooks
from .look_ahead import BatchLookAhead
from ..data.stream_state import StreamPosition
from .loop_state import DataPosition, LoopState, TrainPlan, plan_training
from ..runtime.distributed import all_gather_object
from .loss_scaling import LossRule, WindowScaler, default_count, probe_loss_rule

if TYPE_CHECKING:
    from torch import nn
    from torch.utils.data import DataLoader

    from .contract import RunParts, RunTrainer

__all__ = ["TrainingRun", "finish", "log_save_evaluate", "log_training_window", "logged_learning_rate", "window_scaler"]

logger = logging.getLogger("trainwell.trainer.trainer")
T = TypeVar("T")


class TrainingRun:
    """What one ``train()`` call trains with, built once: the plan, the data, the model and its wrapper, the
    optimizer and schedule, the backend, the callbacks, the loop's state and the preemption check.

    ``parts`` are the Trainer's own parts the run uses (:class:`~trainwell.loops.contract.RunParts`).
    ``batch_size`` and ``optimizers`` are given by ``auto_find_batch_size``'s retry (the smaller batch, and the
    optimizer and schedule passed to the Trainer, so that the failed attempt's are rebuilt); otherwise the Trainer's
    current ones are used.
    """

    def __init__(self, trainer: RunTrainer, *, parts: RunParts, resume_from: Path | None = None, trial: Any = None,
                 ignore_keys_for_eval: list[str] | None = None, batch_size: int | None = None,
                 optimizers: tuple[torch.optim.Optimizer | None, Any] | None = None) -> None:
        args = trainer.args
        self.trainer, self.args, self.trial, self.ignore_keys_for_eval = trainer, args, trial, ignore_keys_for_eval
        self.backend, self.callbacks = trainer.backend, trainer.callback_handler
        self.parts = parts
        self.checkpoints = parts.checkpoints  # the resume, the preemption check, the background save
        self.resumed_from, self.warned_non_finite = resume_from, False
        self.start_time = 0.0  # set by the loop when the first event is sent
        if batch_size is not None:
            trainer._train_batch_size = batch_size
        if optimizers is not None:
            trainer.optimizer, trainer.lr_scheduler = optimizers
        batch_size = trainer._train_batch_size or args.train_batch_size
        # 1. The data and how long training runs.
        self.dataloader: DataLoader = trainer.get_train_dataloader()
        self.plan: TrainPlan = plan_training(args, self.dataloader, args.world_size, batch_size)
        # the loader's one-batch look-ahead: a stateful part of the checkpoint (its random states, per rank)
        # and the position of a stream that can say it (its state after the batches the steps consumed, per rank)
        self.stream = StreamPosition.of(self.dataloader, world_size=args.world_size)
        self.look_ahead = BatchLookAhead(collator_draws_randomness(self.dataloader), self.stream)
        # 2. A fresh state (a resume replaces it in 4.) and control.
        trainer.state = self._fresh_state(trainer.state)
        trainer.control = TrainerControl()
        # 3. The model prepared: checkpointing, the backend's wrapping, the hooks, optimizer and schedule, compile.
        optimizer_given = trainer.optimizer is not None
        self.hooks = self._prepare_model()
        try:
            self.model: nn.Module = trainer.model
            self.wrapped: nn.Module = trainer.model_wrapped
            train_mode = getattr(trainer.optimizer, "train", None)
            if callable(train_mode):  # schedule-free optimizers: train mode, as upstream
                train_mode()
            # 4. The checkpoint resumed: weights, optimizer, schedule, random states (the look-ahead's too),
            # TrainerState, data position.
            position = DataPosition()
            if resume_from is not None:
                before = {id(p) for p in trainer.model.parameters()}
                resumed = self.checkpoints.load(resume_from, self.plan, self.look_ahead, self.stream)
                position = resumed.position
                if resumed.state is not None:
                    trainer.state = resumed.state
                self._adopt_replaced_parameters(resume_from, optimizer_given, before)
        except BaseException:
            self.hooks.detach()
            raise
        # 5. The loop's own state, starting at the data position.
        self.loop = LoopState.start(position, device=args.device, nan_inf_filter=args.logging_nan_inf_filter,
                                    accumulation_steps=args.gradient_accumulation_steps, rank=args.process_index,
                                    world_size=args.world_size)
        self.loop.steps_at_start = trainer.state.global_step  # the speed counts the steps this call runs
        position.batches_per_epoch, position.train_batch_size = self.plan.micro_batches_per_epoch, batch_size
        self.callbacks.train_dataloader = self.dataloader
        parts.register(self)
        if logger.isEnabledFor(logging.INFO):
            self._log_start(batch_size)

    def _log_start(self, batch_size: int) -> None:
        """Upstream's "***** Running training *****" summary, at INFO (so ``log_level`` decides who sees it)."""
        args, plan, state, position = self.args, self.plan, self.trainer.state, self.loop.position
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        lines = ["***** Running training *****"]
        if plan.num_examples is not None:
            lines.append(f"  Num examples = {plan.num_examples:,}")
        lines.append(f"  Num Epochs = {plan.num_epochs:,}")
        if plan.updates_per_epoch is not None:
            lines.append(f"  Num update steps per epoch = {plan.updates_per_epoch:,}")
        lines += [f"  Instantaneous batch size per device = {batch_size:,}",
                  f"  Total train batch size (w. parallel, distributed & accumulation) = "
                  f"{plan.total_train_batch_size:,}",
                  f"  Gradient Accumulation steps = {args.gradient_accumulation_steps}",
                  f"  Total optimization steps = {plan.max_steps:,}",
                  f"  Number of trainable parameters = {trainable:,}"]
        if self.resumed_from is not None:
            lines.append(f"  Resuming training from checkpoint with epoch {position.epoch} and global step "
                         f"{state.global_step}")
        for line in lines:
            logger.info(line)

    @property
    def state(self) -> TrainerState:
        """The run's TrainerState (the Trainer's: a resume or a callback may replace the object)."""
        return self.trainer.state

    def _fresh_state(self, previous: TrainerState) -> TrainerState:
        trainer, plan = self.trainer, self.plan
        state = TrainerState(is_local_process_zero=trainer.is_local_process_zero(),
                             is_world_process_zero=trainer.is_world_process_zero(),
                             stateful_callbacks=getattr(previous, "stateful_callbacks", None) or {})
        state.compute_steps(self.args, plan.max_steps)
        state.max_steps, state.num_train_epochs = plan.max_steps, plan.num_epochs
        state.train_batch_size = trainer._train_batch_size
        state.epoch = 0.0
        return state

    def _prepare_model(self) -> train_hooks.TrainHooks:
        trainer, args, backend = self.trainer, self.args, self.backend
        checkpointing, checkpointing_kwargs = activation_checkpointing(args)  # upstream 5.24's names
        if checkpointing:
            enable_gradient_checkpointing(unwrap_model(trainer.model), checkpointing_kwargs)
        backend.prepare_model(trainer.model, training=True)
        trainer.model = _set_by(backend.model, f"{type(backend).__name__}.prepare_model", "the model")
        hooks = train_hooks.attach(args, trainer.model, self.callbacks,  # none unless the arguments ask
                                   autocast=backend.autocast)
        try:
            trainer.create_optimizer_and_scheduler(num_training_steps=self.plan.max_steps)
            optimizer = _set_by(trainer.optimizer, "create_optimizer_and_scheduler (or an override of it)",
                                "self.optimizer")
            backend.num_training_steps = self.plan.max_steps  # read by backends that build their own schedule
            backend.setup_optimization(optimizer, trainer.lr_scheduler)
            trainer.optimizer, trainer.lr_scheduler = backend.optimizer, backend.lr_scheduler  # ZeRO rebuilds them
            self.parts.adopt_input_dtype()
            # set by setup_optimization too: DeepSpeed's engine only exists from there
            wrapped = _set_by(backend.wrapped, f"{type(backend).__name__}.setup_optimization", "the wrapped model")
            if args.torch_compile:
                wrapped = compile_model(wrapped, args, in_engine=backend.caps.compiles_in_engine)
            trainer.model_wrapped = wrapped
        except BaseException:
            hooks.detach()
            raise
        self.callbacks.model, self.callbacks.optimizer = trainer.model, trainer.optimizer
        self.callbacks.lr_scheduler = trainer.lr_scheduler
        return hooks

    def _adopt_replaced_parameters(self, folder: Path, optimizer_given: bool, before: set[int]) -> None:
        """After a resume, the optimizer steps the model's parameters, even where ``_load_from_checkpoint`` (an
        override: ``load_state_dict(..., assign=True)``, a re-created module) replaced them (``before``: the ids of
        the model's parameters before the load).

        Upstream loads the weights first and builds the optimizer after; here the optimizer and schedule, built
        before the load, are built again over the loaded parameters and given the states just restored (the same
        end). Where they cannot be built again (passed to the Trainer, or held by a wrapper or an engine), the run
        is refused with the fix rather than stepping parameters the model no longer uses.
        """
        trainer, backend = self.trainer, self.backend
        current = {id(p) for p in trainer.model.parameters()}
        dropped = [p for group in getattr(trainer.optimizer, "param_groups", None) or [] for p in group["params"]
                   if id(p) in before and id(p) not in current]
        if not dropped:
            return
        own_wrapper = backend.wrapped is not backend.model or trainer.model_wrapped is not trainer.model
        if optimizer_given or own_wrapper or backend.caps.handles_grad_accumulation or backend.caps.sharded_state:
            missing = parameters_outside(trainer.model, trainer.optimizer)
            holder = ("was passed to the Trainer" if optimizer_given else
                      f"is held by {type(backend).__name__}'s wrapper or engine")
            raise RuntimeError(
                f"After resuming from {folder}, the optimizer holds {len(dropped)} parameters the model no longer has, "
                f"and {len(missing)} trainable parameters of the model are not in it ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}): _load_from_checkpoint replaced them "
                f"(load_state_dict(..., assign=True) or a re-created module), and the optimizer {holder}, so it "
                "cannot be built again over them. Load the weights into the existing parameters "
                "(model.load_state_dict(state_dict) without assign=True, or parameter.data.copy_(...)).")
        previous = trainer.optimizer
        assert previous is not None  # it holds the dropped parameters
        optimizer_state = previous.state_dict()
        scheduler = trainer.lr_scheduler
        scheduler_state = scheduler.state_dict() if hasattr(scheduler, "state_dict") else None
        trainer.optimizer, trainer.lr_scheduler = None, None
        trainer.create_optimizer_and_scheduler(num_training_steps=self.plan.max_steps)
        rebuilt: torch.optim.Optimizer | None = trainer.optimizer  # set again by the call above
        optimizer = _set_by(rebuilt, "create_optimizer_and_scheduler (or an override of it)", "self.optimizer")
        optimizer.load_state_dict(optimizer_state)
        if scheduler_state is not None and trainer.lr_scheduler is not None:
            trainer.lr_scheduler.load_state_dict(scheduler_state)
        backend.setup_optimization(optimizer, trainer.lr_scheduler)
        trainer.optimizer, trainer.lr_scheduler = backend.optimizer, backend.lr_scheduler
        self.callbacks.optimizer, self.callbacks.lr_scheduler = trainer.optimizer, trainer.lr_scheduler

    def window_scaler(self, first_batch: Any) -> WindowScaler:
        """How this run's accumulation windows are normalised (see :func:`window_scaler`); the model then takes
        ``num_items_in_batch`` exactly when its loss sums over the window's items (``model_accepts_loss_kwargs``,
        upstream's attribute, unless a ``compute_loss_func`` decides)."""
        scaler = window_scaler(self, first_batch)
        if self.trainer.compute_loss_func is None:
            self.trainer.model_accepts_loss_kwargs = scaler.rule.takes_num_items
        return scaler

    def close(self) -> None:
        """Take off what the run attached to the model and callbacks (after an error too; idempotent)."""
        self.hooks.detach()


def parameters_outside(model: nn.Module, optimizer: Any) -> list[str]:
    """The names of ``model``'s trainable parameters that ``optimizer``'s parameter groups do not hold."""
    held = {id(p) for group in getattr(optimizer, "param_groups", None) or [] for p in group["params"]}
    return [name for name, p in model.named_parameters() if p.requires_grad and id(p) not in held]


def _set_by(value: T | None, setter: str, what: str) -> T:
    """``value``, which ``setter`` must have set (an error naming both otherwise)."""
    if value is None:
        raise RuntimeError(f"{setter} left {what} unset (None); it must set it before training can start")
    return value


def log_training_window(run: TrainingRun, grad_norm: torch.Tensor | float | None,
                        start_time: float | None = None, learning_rate: float | None = None) -> None:
    """Log the mean loss of the steps since the last log, the gradient norm and the learning rate (``learning_rate``
    when given, as upstream; through ``trainer.log(logs, start_time)``, as upstream; an override of the older
    ``log(logs)`` gets ``logs`` only)."""
    trainer, loop, state = run.trainer, run.loop, run.state
    steps = state.global_step - loop.last_logged_step
    window = loop.close_window(state.global_step)
    if not math.isfinite(window) and not run.warned_non_finite:
        # As upstream, a nan/inf loss is logged and training goes on; stopping is the opt-in
        # StopOnNonFiniteLossCallback.
        run.warned_non_finite = True
        logger.warning("The training loss is %s in the %d steps before step %d; training goes on (as "
                       "upstream). Add StopOnNonFiniteLossCallback() to the callbacks to stop when the weights "
                       "diverge.", window, steps, state.global_step)
    logs: dict[str, float] = {"loss": window / steps}
    if grad_norm is not None:
        logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
    logs["learning_rate"] = learning_rate if learning_rate is not None else logged_learning_rate(run)
    trainer.store_flos()
    call_override(trainer, "log", logs, start_time=start_time)


def logged_learning_rate(run: TrainingRun) -> float:
    """The rate the last optimizer step used (upstream >= 4.5x logs it, not the one the scheduler moved to)."""
    used = run.loop.step_learning_rate
    return float(used) if used is not None else run.trainer._get_learning_rate()


def log_save_evaluate(run: TrainingRun | None, tr_loss: torch.Tensor, grad_norm: torch.Tensor | float | None,
                      model: nn.Module, trial: Any, ignore_keys_for_eval: list[str] | None,
                      start_time: float | None = None, learning_rate: float | None = None) -> None:
    """The Trainer's ``_maybe_log_save_evaluate``: log, evaluate and save as ``control`` asks, in that order; the
    best metric is tracked at every evaluation (``load_best_model_at_end``, rotation and ``save_strategy="best"``
    need it). A missing ``metric_for_best_model`` raises after the checkpoint due at this step is written."""
    if run is None:
        raise RuntimeError("_maybe_log_save_evaluate is called by the training loop, after train() started its run")
    trainer, args = run.trainer, run.args
    if trainer.control.should_log and run.state.global_step > run.loop.last_logged_step:
        log_training_window(run, grad_norm, start_time, learning_rate)
    if trainer.control.should_evaluate:
        try:
            metrics = trainer._evaluate(trial, ignore_keys_for_eval)
            new_best = trainer._determine_best_metric(metrics=metrics, trial=trial)  # an override is reached
        except MissingMetricError as err:
            model.train()
            if trainer.control.should_save:
                folder = call_override(trainer, "_save_checkpoint", model, trial, tr_loss=tr_loss)
                err.args = (f"{err.args[0]} The checkpoint of this step was saved first: {folder}",)
            raise
        model.train()
        if new_best and args.save_strategy == SaveStrategy.BEST:
            trainer.control.should_save = True
    if trainer.control.should_save:
        call_override(trainer, "_save_checkpoint", model, trial, tr_loss=tr_loss)  # old (model, trial) overrides
        trainer.control = run.callbacks.on_save(args, run.state, trainer.control)


def finish(run: TrainingRun) -> TrainOutput:
    """The end of a run: final metrics, best-model reload, rotation, ``on_train_end`` (the Trainer has left
    training: ``is_in_train`` is False, so a callback's evaluation casts as evaluation outside training does)."""
    trainer, args, plan, loop = run.trainer, run.args, run.plan, run.loop
    run.checkpoints.wait()  # async_save: the last (or preemption) save is committed before train() returns
    state = run.state
    train_loss = loop.final_total() / max(state.global_step, 1)
    if args.load_best_model_at_end and state.best_model_checkpoint is not None and not run.checkpoints.preempted:
        trainer._load_best_model()
    num_samples: float
    if plan.micro_batches_per_epoch and plan.num_examples is not None and args.max_steps <= 0:
        num_samples = plan.num_examples * args.num_train_epochs
    else:
        num_samples = plan.max_steps * plan.total_train_batch_size
    # The steps and samples this call ran, as upstream 5.x: a preempted, stopped or resumed run did not run the
    # whole plan (upstream 4.x divided the planned max_steps by the runtime).
    steps_run = state.global_step - loop.steps_at_start
    num_samples = num_samples * steps_run / max(plan.max_steps, 1)
    tokens = loop.tokens_trained if args.include_tokens_per_second else None  # per device, seen
    metrics = reporting.speed_metrics("train", run.start_time, num_samples=num_samples, num_steps=steps_run,
                                      num_tokens=tokens)
    trainer.store_flos()
    metrics["total_flos"] = state.total_flos
    metrics["train_loss"] = train_loss
    metrics["epoch"] = float(state.epoch or 0.0)  # set (0.0 up) since the run started
    trainer._memory_tracker.stop_and_update_metrics(metrics, stage="train")
    trainer.log(metrics)
    trainer._rotate_checkpoints(output_dir=args.output_dir)
    trainer._finish_current_push()
    trainer.control = run.callbacks.on_train_end(args, run.state, trainer.control)
    return TrainOutput(run.state.global_step, train_loss, metrics)


def _prepares_inputs_itself(trainer: RunTrainer) -> bool:
    """Whether ``_prepare_inputs`` is a subclass's (a library's or a script's), not trainwell's own."""
    method = getattr(type(trainer), "_prepare_inputs", None)
    return not str(getattr(method, "__module__", "trainwell.")).startswith("trainwell.")


def window_scaler(run: TrainingRun, first_batch: Any) -> WindowScaler:
    """How this run's accumulation windows are normalised (see ``loops.loss_scaling``); decided once per
    ``train()`` from the first micro-batch, probing the model only when a window can hold several batches."""
    trainer, args = run.trainer, run.args
    ignored = all_labels_ignored(first_batch, trainer.label_names or ["labels"])
    if ignored is not None:
        logger.warning("every entry of `%s` in the first batch is -100 (the index the loss ignores): its loss averages "
                       "over no label, so it is 0 (or nan) and nothing is learnt. Check how the labels are built (a "
                       "prompt mask or a response template that masks everything, a max_length cutting the answer "
                       "off, padding labels with -100 beyond the sequence)", ignored)
    across = bool(args.average_tokens_across_devices) and args.world_size > 1
    if trainer.compute_loss_func is not None:  # it receives the window's labels, as upstream
        rule = LossRule(True, "labels", "compute_loss_func")
    elif trainer.label_smoother is not None:  # a mean over the labels (LabelSmoother), shifted for a causal LM
        shifted = is_causal_lm(trainer.model)
        rule = LossRule(False, "shifted" if shifted else "labels",
                        "label smoothing, causal LM" if shifted else "label smoothing")
    elif not run.parts.compute_loss_takes_num_items():  # an override of the older signature: not probed (it may
        rule = LossRule(False, "rows", "compute_loss without num_items_in_batch")  # have side effects)
    elif args.gradient_accumulation_steps == 1 and not across:  # each step is one batch: the model's own mean
        # still counted for num_items_in_batch where upstream counts (a forward taking loss kwargs): its items
        rule = LossRule(False, default_count(trainer.model), "one micro-batch per step")
        return WindowScaler(rule, device=args.device, world_size=args.world_size, across_ranks=False,
                            count_single=accepts_loss_kwargs(trainer.model))
    elif _prepares_inputs_itself(trainer):  # TRL's GRPO/RLOO generate there: a probe would generate once more
        rule = LossRule(False, "rows", "_prepare_inputs overridden (not probed: it may have side effects)")
    else:
        rule = probe_loss_rule(trainer.model, trainer._prepare_inputs(first_batch))
        if args.world_size > 1:  # every rank counts alike (each probed its own first batch): rank 0's rule
            rule = all_gather_object(rule)[0]
        logger.info("Gradient accumulation with %s: %s", type(unwrap_model(trainer.model)).__name__,
                    rule.describe())
    return WindowScaler(rule, device=args.device, world_size=args.world_size, across_ranks=across)
