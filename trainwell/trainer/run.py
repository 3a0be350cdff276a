"""The training run's bookkeeping around the loop: a fresh state, the model prepared for training, the logging
window, the best metric, the end-of-training metrics, the loss-scaling decision and the model used for inference.

Functions of the :class:`~trainwell.trainer.trainer.Trainer` facade (its methods ``_init_state``,
``_prepare_for_training``, ``_finish_training``... delegate here), kept apart so that the facade stays a list of
upstream names; where upstream calls an overridable method (``_save_checkpoint``, ``log``, ``evaluate``), the
Trainer's is called, so that an override is reached.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..callbacks.state import TrainerControl, TrainerState
from ..loops import train_hooks
from ..utils import reporting
from ..utils.losses import all_labels_ignored
from ..utils.overrides import call_override
from ..utils.model_utils import activation_checkpointing, compile_model, enable_gradient_checkpointing, is_causal_lm
from ..utils.model_utils import unwrap_model
from ..utils.trainer_utils import TrainOutput
from .setup import is_bitsandbytes_quantized

if TYPE_CHECKING:  # trainer.py imports this module: the Trainer is named for the type checker only
    from ..loops.loss_scaling import WindowScaler
    from ..loops.loop_state import LoopState
    from ..loops.train_loop import TrainPlan
    from .trainer import Trainer

logger = logging.getLogger("trainwell.trainer.trainer")


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


def _loop_of(trainer: Trainer) -> LoopState:
    """The running loop's state (set by the loop before any of the functions below is called)."""
    loop = trainer._tw_loop
    if loop is None:
        raise RuntimeError("the training loop's state is read before train() started the loop")
    return loop


def init_state(trainer: Trainer, plan: TrainPlan) -> None:
    """A fresh TrainerState for this run (the loop fills it; a resume replaces it)."""
    trainer.state = TrainerState(is_local_process_zero=trainer.is_local_process_zero(),
                              is_world_process_zero=trainer.is_world_process_zero(),
                              stateful_callbacks=getattr(trainer.state, "stateful_callbacks", None) or {})
    trainer.state.compute_steps(trainer.args, plan.max_steps)
    trainer.state.max_steps = plan.max_steps
    trainer.state.num_train_epochs = plan.num_epochs
    trainer.state.train_batch_size = trainer._train_batch_size
    trainer.state.epoch = 0.0
    trainer.control = TrainerControl()
    trainer.current_flos = 0.0
    trainer._tw_plan = plan


def prepare_for_training(trainer: Trainer, max_steps: int) -> nn.Module:
    """Gradient checkpointing, wrapping by the backend, torch.compile, optimizer and scheduler."""
    checkpointing, checkpointing_kwargs = activation_checkpointing(trainer.args)  # upstream 5.24's names
    if checkpointing:
        enable_gradient_checkpointing(unwrap_model(trainer.model), checkpointing_kwargs)
    trainer.backend.prepare_model(trainer.model, training=True)
    trainer.model = trainer.backend.model
    train_hooks.attach(trainer)  # neftune noise, underflow/overflow detector: none unless asked for
    trainer.create_optimizer_and_scheduler(num_training_steps=max_steps)
    trainer.backend.num_training_steps = max_steps  # read by backends that build their own schedule (DeepSpeed)
    trainer.backend.setup_optimization(trainer.optimizer, trainer.lr_scheduler)
    backend = trainer.backend
    trainer.optimizer, trainer.lr_scheduler = backend.optimizer, backend.lr_scheduler  # ZeRO rebuilds them
    trainer._adopt_input_dtype()
    wrapped = trainer.backend.wrapped  # set by setup_optimization too: DeepSpeed's engine only exists from there
    if trainer.args.torch_compile:
        wrapped = compile_model(wrapped, trainer.args, in_engine=trainer.backend.caps.compiles_in_engine)
    trainer.model_wrapped = wrapped
    trainer.callback_handler.model = trainer.model
    trainer.callback_handler.optimizer = trainer.optimizer
    trainer.callback_handler.lr_scheduler = trainer.lr_scheduler
    return wrapped


def log_training_window(trainer: Trainer, tr_loss: torch.Tensor, grad_norm: torch.Tensor | float | None,
                        start_time: float | None = None) -> None:
    """Log the mean loss of the steps since the last log, the gradient norm and the learning rate (through
    ``trainer.log(logs, start_time)``, as upstream; an override of the older ``log(logs)`` gets ``logs`` only)."""
    loop = _loop_of(trainer)
    steps = trainer.state.global_step - loop.last_logged_step
    window = loop.close_window(trainer.state.global_step)
    if not math.isfinite(window) and not trainer._tw_warned_non_finite:
        # As upstream, a nan/inf loss is logged and training goes on; stopping is the opt-in
        # StopOnNonFiniteLossCallback.
        trainer._tw_warned_non_finite = True
        logger.warning("The training loss is %s in the %d steps before step %d; training goes on (as "
                       "upstream). Add StopOnNonFiniteLossCallback() to the callbacks to stop when the weights "
                       "diverge.", window, steps, trainer.state.global_step)
    logs: dict[str, float] = {"loss": window / steps}
    if grad_norm is not None:
        logs["grad_norm"] = grad_norm.item() if isinstance(grad_norm, torch.Tensor) else float(grad_norm)
    logs["learning_rate"] = trainer._logged_learning_rate()
    trainer.store_flos()
    call_override(trainer, "log", logs, start_time=start_time)


def is_new_best(trainer: Trainer, metrics: dict[str, float] | None) -> bool:
    """Record ``best_metric`` / ``best_global_step``; True when ``metrics`` improve on the best so far."""
    name = trainer.args.metric_for_best_model
    if not metrics or not name:
        return False
    value = metric_value(metrics, name)
    better = (lambda a, b: a > b) if trainer.args.greater_is_better else (lambda a, b: a < b)
    if trainer.state.best_metric is None or better(value, trainer.state.best_metric):
        trainer.state.best_metric = value
        trainer.state.best_global_step = trainer.state.global_step
        return True
    return False


def finish_training(trainer: Trainer, tr_loss: torch.Tensor, plan: TrainPlan, start_time: float) -> TrainOutput:
    """Final metrics, best-model reload, rotation, on_train_end."""
    trainer._tw_checkpoints.wait()  # async_save: the last (or preemption) save is committed before train() returns
    loop = _loop_of(trainer)
    steps = max(trainer.state.global_step, 1)
    train_loss = loop.final_total() / steps
    args, state = trainer.args, trainer.state
    if args.load_best_model_at_end and state.best_model_checkpoint is not None and not trainer.preempted:
        trainer._load_best_model()
    num_samples: float
    if plan.micro_batches_per_epoch and plan.num_examples is not None and trainer.args.max_steps <= 0:
        num_samples = plan.num_examples * trainer.args.num_train_epochs
    else:
        num_samples = plan.max_steps * plan.total_train_batch_size
    # The steps and samples this call ran, as upstream 5.x: a preempted, stopped or resumed run did not run the
    # whole plan (upstream 4.x divided the planned max_steps by the runtime).
    steps_run = trainer.state.global_step - loop.steps_at_start
    num_samples = num_samples * steps_run / max(plan.max_steps, 1)
    tokens = loop.tokens_trained if trainer.args.include_tokens_per_second else None  # per device, seen
    metrics = reporting.speed_metrics("train", start_time, num_samples=num_samples, num_steps=steps_run,
                                      num_tokens=tokens)
    trainer.store_flos()
    metrics["total_flos"] = trainer.state.total_flos
    metrics["train_loss"] = train_loss
    metrics["epoch"] = float(trainer.state.epoch or 0.0)  # set (0.0 up) since init_state
    trainer.is_in_train = False
    trainer._memory_tracker.stop_and_update_metrics(metrics, stage="train")
    trainer.log(metrics)
    trainer._rotate_checkpoints(output_dir=trainer.args.output_dir)
    trainer._finish_current_push()
    trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
    return TrainOutput(trainer.state.global_step, train_loss, metrics)


def window_scaler(trainer: Trainer, first_batch: Any) -> WindowScaler:
    """How this run's accumulation windows are normalised (see ``loops.loss_scaling``); decided once per
    ``train()`` from the first micro-batch, probing the model only when a window can hold several batches."""
    from ..loops.loss_scaling import LossRule, WindowScaler, probe_loss_rule  # loaded by the first train()
    from ..runtime.distributed import all_gather_object

    args = trainer.args
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
    elif not trainer._compute_loss_takes_num_items():  # an override of the older signature: not probed (it may
        rule = LossRule(False, "rows", "compute_loss without num_items_in_batch")  # have side effects)
    elif args.gradient_accumulation_steps == 1 and not across:  # each step is one batch: the model's own mean
        rule = LossRule(False, "labels", "one micro-batch per step")
    else:
        rule = probe_loss_rule(trainer.model, trainer._prepare_inputs(first_batch))
        if args.world_size > 1:  # every rank counts alike (each probed its own first batch): rank 0's rule
            rule = all_gather_object(rule)[0]
        logger.info("Gradient accumulation with %s: %s", type(unwrap_model(trainer.model)).__name__,
                    rule.describe())
    if trainer.compute_loss_func is None:
        trainer.model_accepts_loss_kwargs = rule.takes_num_items
    return WindowScaler(rule, device=args.device, world_size=args.world_size, across_ranks=across)


def model_for_eval(trainer: Trainer) -> nn.Module:
    """The model to run inference with: on the device, cast for ``fp16/bf16_full_eval`` outside training."""
    model = trainer.model
    if not trainer.is_in_train and trainer.backend.caps.sharded_state:
        # ZeRO-3 inference: the backend shards the model (a no-op when training already did)
        engine = trainer.backend.prepare_model(model, training=False)
        trainer._adopt_input_dtype()
        return engine
    if not trainer.is_in_train:
        if trainer.args.fp16_full_eval:
            model = model.to(dtype=torch.float16, device=trainer.args.device)
        elif trainer.args.bf16_full_eval:
            model = model.to(dtype=torch.bfloat16, device=trainer.args.device)
        elif trainer.place_model_on_device or (trainer.backend.caps.places_model and not trainer.is_model_parallel):
            model = model.to(trainer.args.device)  # (DeepSpeed ZeRO-1/2 before training: upstream's engine places it)
    if trainer._tw_n_gpu > 1 and not isinstance(model, nn.DataParallel) and not is_bitsandbytes_quantized(model):
        # Upstream's evaluation_loop -> _wrap_model(training=False): with several GPUs in one process the model is
        # wrapped in nn.DataParallel for evaluation too (not a quantized one), so the n_gpu-times batch is split
        # over the GPUs instead of running on GPU 0 alone (model parallelism forced n_gpu to 1 already)
        model = nn.DataParallel(model)
    return model
