"""The Trainer facade: the upstream public, overridable methods, composing the loops, backends and checkpoints."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.utils.data import Dataset

from ..args.fields import TrainingArguments
from ..args.data_options import tokens_seen_mode
from ..callbacks import DefaultFlowCallback, PrinterCallback, ProgressCallback, TrainerCallback
from ..callbacks.events import CallbackHandler
from ..callbacks.integrations import get_reporting_integration_callbacks
from ..utils.trainer_state import TrainerControl, TrainerState
from ..loops import eval_loop
from ..loops.best_metric import is_new_best, metric_value
from ..utils import reporting
from ..utils.checkpoint_names import PREFIX_CHECKPOINT_DIR
from ..utils.logging_utils import setup_process_logging
from ..utils.losses import LabelSmoother, explain_backward_error, explain_rejected_labels, extract_loss
from ..utils.model_utils import accepts_loss_kwargs, default_label_names, flops_rule, forward_parameters, is_causal_lm
from ..utils.model_utils import unwrap_model
from ..utils.outputs import EvalLoopOutput, PredictionOutput, TrainOutput
from ..utils.overrides import accepts, call_override
from ..utils.seeding import enable_full_determinism, set_seed
from .checkpointing import save_load_defaults
from .checkpointing.checkpoints import TrainerCheckpoints
from .checkpointing.preemption_report import raise_if_preempted
from .eval_model import model_for_eval
from .init_checks import (call_model_init, check_args_object, check_before_training, check_metric_for_best_model,
                          check_quantized_model, initial_model, is_bitsandbytes_quantized)
from .inputs import BatchMover
from .checkpointing.output_dir_runs import require_output_dir
from .run_fields import RunField

if TYPE_CHECKING:  # imported where used: `from trainwell import Trainer` does not load them (test_overhead_guard.py)
    from ..loops.contract import RunParts
    from ..loops.run import TrainingRun
    from .accelerator import TrainerAccelerator
    from .hub import TrainerHub

logger = logging.getLogger("trainwell.trainer.trainer")

DEFAULT_CALLBACKS: list[type[TrainerCallback]] = [DefaultFlowCallback]
# What a hyper-parameter search's trials replace on the Trainer (see _tw_search_scope).
_SEARCH_REPLACES = ("args", "state", "control", "model", "model_wrapped", "optimizer", "lr_scheduler",
                    "label_smoother", "_tw_checkpoints", "backend")


def _label_smoother(args: TrainingArguments, model: Any) -> LabelSmoother | None:
    """``args.label_smoothing_factor``'s smoother; none for a multi-label classifier (its loss is a binary cross
    entropy per label, which smoothing over classes does not fit), with upstream's warning."""
    if not args.label_smoothing_factor:
        return None
    if getattr(getattr(model, "config", None), "problem_type", None) == "multi_label_classification":
        warnings.warn("Label smoothing is not compatible with multi-label classification. Disabling label smoothing "
                      "for this training run.", UserWarning, stacklevel=3)
        return None
    return LabelSmoother(args.label_smoothing_factor)


def _no_flops(inputs: Any) -> int:
    return 0


class Trainer:
    """Train, evaluate and predict with any ``nn.Module`` that returns its loss (tuple first, or ``"loss"``).

    The constructor and every public method follow the upstream ``transformers.Trainer``; subclass and override
    ``compute_loss``, ``training_step``, ``create_optimizer``, ``get_train_dataloader``... exactly as there.

    It is composed of parts with explicit inputs, each the one attribute holding its state: the checkpoints
    (``_tw_checkpoints``, :mod:`trainwell.trainer.checkpointing.checkpoints`), the hub (``_tw_hub``,
    :mod:`trainwell.trainer.hub`), the ``accelerator`` emulation; the upstream methods delegate to them in a few
    lines. trainwell's own private attributes all start with ``_tw_`` (the others are upstream's, with upstream's
    meaning), so that a subclass's own names (``_loop``, ``_parts``...) never collide with them.
    """

    # As upstream: True in a subclass whose compute_loss already normalises over the whole accumulated batch, False
    # for a per-micro-batch mean; None decides from num_items_in_batch.
    loss_is_scaled_for_ga: bool | None = None
    # Upstream's attributes whose values are the running train() call's (its loop state holds them).
    current_flos = RunField("flos", 0.0, "FLOPs counted since the last ``store_flos`` (upstream's attribute).")
    current_gradient_accumulation_steps = RunField(
        "accumulation_divisor", 1, "What ``training_step`` divides a per-micro-batch mean loss by (upstream's "
        "attribute): the loop sets it for every micro-batch to the window's items (labels, or rows) over this "
        "micro-batch's, so that the window sums to the mean loss of one big batch.")
    _total_loss_scalar = RunField("total_loss", 0.0, "The loss of the logged windows summed (upstream's attribute).")
    _globalstep_last_logged = RunField("last_logged_step", 0, "The global step of the last training log (upstream's).")

    def __init__(
        self,
        model: nn.Module | None = None,
        args: TrainingArguments | None = None,
        data_collator: Callable[[list[Any]], Any] | None = None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: Any = None,
        model_init: Callable[..., nn.Module] | None = None,
        compute_loss_func: Callable[..., torch.Tensor] | None = None,
        compute_metrics: Callable[..., Mapping[str, Any]] | None = None,
        callbacks: list[TrainerCallback | type] | None = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        optimizer_cls_and_kwargs: tuple[type, dict[str, Any]] | None = None,
        preprocess_logits_for_metrics: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        tokenizer: Any = None,
    ) -> None:
        from ..backends import build_backend  # loaded by the first Trainer, not by the import
        from ..data.collators import DataCollatorWithPadding, default_data_collator
        from ..runtime.accelerate_env import apply_accelerate_env, ensure_accelerator_state
        from ..runtime.memory import TrainerMemoryTracker

        if args is None:
            logger.info("No `TrainingArguments` passed, using `output_dir=tmp_trainer`.")
            args = TrainingArguments(output_dir="tmp_trainer")
        check_args_object(args)
        self.args = args
        self._tw_run: TrainingRun | None = None  # the running (or last) train() call's run
        self._tw_before_run: dict[str, Any] = {}  # the RunField attributes' values before the first run
        apply_accelerate_env(args)  # `accelerate launch` config -> arguments, before the device is resolved
        setup_process_logging(args)
        if tokenizer is not None:
            warnings.warn("`tokenizer` is deprecated, use `processing_class` instead", FutureWarning, stacklevel=2)
            processing_class = processing_class if processing_class is not None else tokenizer
        # the device set up first (set_device; the process group under a launcher), as upstream's arguments do in
        # __post_init__: the memory tracker's CUDA readings are then this rank's GPU, not GPU 0
        args.device  # noqa: B018
        ensure_accelerator_state(args)  # what upstream's Accelerator sets up; libraries read it (TRL's set_seed)
        self._memory_tracker = TrainerMemoryTracker(args.skip_memory_metrics)
        self._memory_tracker.start()
        enable_full_determinism(args.seed) if args.full_determinism else set_seed(args.seed)
        self.model_init = model_init
        self.backend = build_backend(args)
        self._tw_n_gpu = args.n_gpu  # a hot-path copy of a lazily computed property
        model = initial_model(model, model_init, self.call_model_init)
        self.processing_class = processing_class
        if data_collator is None:
            data_collator = (DataCollatorWithPadding(processing_class) if hasattr(processing_class, "pad")
                             or hasattr(processing_class, "pad_token_id") else default_data_collator)
        self.data_collator = data_collator
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        check_before_training(args, train_dataset, eval_dataset)
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        check_metric_for_best_model(args, compute_metrics, custom_evaluation=type(self).evaluate is not Trainer.evaluate
                                    or type(self).evaluation_loop is not Trainer.evaluation_loop)
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self._created_lr_scheduler = False  # upstream's flag: a schedule create_scheduler built is rebuilt per train()
        self.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs
        if self.optimizer is not None and optimizer_cls_and_kwargs is not None:
            raise ValueError("Pass either `optimizers` or `optimizer_cls_and_kwargs`, not both")
        self._adopt_model(model)
        self.label_smoother = _label_smoother(args, self.model)
        inferred = default_label_names(self.model)  # upstream's find_labels; a bare forward(**kwargs): ["labels"]
        self.label_names = list(args.label_names) if args.label_names is not None else inferred
        self._signature_columns: list[str] | None = None
        self._eval_dataloaders: dict[str, Any] = {}  # upstream's: one loader per eval set under persistent workers
        self.state = TrainerState(is_local_process_zero=self.is_local_process_zero(),
                                  is_world_process_zero=self.is_world_process_zero())
        self.control = TrainerControl()
        default = DEFAULT_CALLBACKS + get_reporting_integration_callbacks(args.report_to)
        default.append(PrinterCallback if args.disable_tqdm else ProgressCallback)
        self.callback_handler = CallbackHandler(default + list(callbacks or []), self.model, processing_class,
                                                self.optimizer, self.lr_scheduler)
        self.is_in_train = False
        # The batch size in use: args.train_batch_size, lowered by auto_find_batch_size after out-of-memory errors.
        self._train_batch_size = self._tw_requested_batch_size = args.train_batch_size
        self._past: Any = None
        self._tw_mover = BatchMover(args.device, nested=self._prepare_input)  # a run's: _adopt_input_dtype
        self._tw_flops_owner: nn.Module | None = None
        self._tw_flops_rule: Callable[[Any], int] = _no_flops
        self._tw_loss_takes_items: tuple[Any, bool] | None = None  # (compute_loss's function, takes num_items_in_batch)
        self._tw_checkpoints = TrainerCheckpoints(self, args=args, backend=self.backend)
        self._tw_hub: TrainerHub | None = None  # built at its first use (see _tw_hub_part)
        self._tw_accelerator: TrainerAccelerator | None = None
        if args.push_to_hub:
            self.init_hf_repo()
        self.control = self.callback_handler.on_init_end(self.args, self.state, self.control)
        model_config = getattr(self.model, "config", None)
        # as upstream: the model's cache only as args.use_cache says (a plain module's dict config is left alone)
        if model_config is not None and not isinstance(model_config, Mapping):
            model_config.use_cache = args.use_cache
        self._memory_tracker.stop_and_update_metrics()

    def _adopt_model(self, model: nn.Module) -> None:
        """Place ``model`` on the device and read what its forward signature tells (return_loss, loss kwargs)."""
        from ..backends.placement import is_model_parallel

        check_quantized_model(model)
        args = self.args
        self.is_model_parallel = is_model_parallel(model, args.device)  # hf_device_map over several devices
        if self.is_model_parallel and args.n_gpu > 1:  # upstream forces n_gpu=1: the model manages the GPUs
            args.__dict__["_runtime_cache"] = (*args._runtime()[:2], 1)
            self._tw_n_gpu = 1
        # upstream's place_model_on_device: the arguments' value when set (a subclass's property), else False for
        # model parallelism, DeepSpeed and FSDP (the backend places the model when it prepares it: FSDP shards it unit
        # by unit) and fp16/bf16_full_eval (cast on the device at evaluation); a bitsandbytes 4/8-bit model is placed
        # when it is loaded (.to raises on it)
        asked = args.place_model_on_device
        self.place_model_on_device = (asked if asked is not None else (
            not self.is_model_parallel and not self.backend.caps.places_model
            and not (args.fp16_full_eval or args.bf16_full_eval))) and not is_bitsandbytes_quantized(model)
        self.model = model.to(args.device) if self.place_model_on_device else model
        self.model_wrapped = self.model
        params = forward_parameters(self.model)
        self.can_return_loss = "return_loss" in params and params["return_loss"].default is True
        self.model_accepts_loss_kwargs = accepts_loss_kwargs(self.model)

    # ------------------------------------------------------------------------------------------------ callbacks
    def add_callback(self, callback: TrainerCallback | type) -> None:
        """Add a callback (an instance, or a class to instantiate) to the current list."""
        self.callback_handler.add_callback(callback)

    def pop_callback(self, callback: TrainerCallback | type) -> TrainerCallback | None:
        """Remove a callback (instance or class) and return it."""
        return self.callback_handler.pop_callback(callback)

    def remove_callback(self, callback: TrainerCallback | type) -> None:
        """Remove a callback (instance or class)."""
        self.callback_handler.remove_callback(callback)

    # ---------------------------------------------------------------------------------------------------- data
    def _set_signature_columns_if_needed(self) -> None:
        """Fill ``self._signature_columns`` (the model's forward arguments and the label names) once; returns None,
        as upstream (callers read the attribute, so an override that sets it is honoured)."""
        from ..data.columns import signature_columns

        if self._signature_columns is None:
            self._signature_columns = signature_columns(self.model, self.label_names)

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
        """``dataset`` (a ``datasets.Dataset``) without the columns the model's forward does not take."""
        from .dataloaders import remove_unused_columns

        return remove_unused_columns(self, dataset, description)

    def _get_collator_with_removed_columns(self, data_collator: Callable[[list[Any]], Any],
                                           description: str | None = None) -> Callable[[list[Any]], Any]:
        """``data_collator`` wrapped so that each example loses the keys the model's forward does not take."""
        from .dataloaders import collator_with_removed_columns

        return collator_with_removed_columns(self, data_collator, description)

    def _get_dataloader(self, dataset: Dataset | None, description: str, batch_size: int,
                        sampler_fn: Callable[[Dataset], Any] | None = None, is_training: bool = False,
                        dataloader_key: str | None = None) -> Any:
        """A DataLoader over ``dataset`` (upstream's helper behind every ``get_*_dataloader``; see
        :func:`trainwell.trainer.dataloaders.trainer_dataloader`)."""
        from .dataloaders import trainer_dataloader

        return trainer_dataloader(self, dataset, description, batch_size, sampler_fn=sampler_fn,
                                  is_training=is_training, dataloader_key=dataloader_key)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        """Seekable shuffling sampler (length-grouped with ``group_by_length``), sharded over ranks."""
        from .dataloaders import model_input_name, train_sampler

        dataset = self.train_dataset if train_dataset is None else train_dataset
        return train_sampler(self.args, dataset, self._train_batch_size,
                             input_name=model_input_name(self.processing_class))

    def _get_eval_sampler(self, dataset: Any) -> Any:
        """The dataset's order (length-grouped with ``group_by_length``, as upstream), each rank a contiguous share
        of every global batch when distributed."""
        from .dataloaders import eval_sampler, model_input_name

        return eval_sampler(self.args, dataset, input_name=model_input_name(self.processing_class))

    def get_train_dataloader(self) -> Any:
        """The training DataLoader (override to customise)."""
        return self._get_dataloader(self.train_dataset, "Training", self._train_batch_size,
                                    sampler_fn=self._get_train_sampler, is_training=True)

    # ------------------------------------------------------------------------------------- optimizer, scheduler
    def get_decay_parameter_names(self, model: nn.Module) -> list[str]:
        """Names of the parameters that get weight decay (not biases, not normalisation weights)."""
        from ..optim.factory import get_decay_parameter_names

        return get_decay_parameter_names(model)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """Build the optimizer unless one was passed: upstream's two parameter groups ``[decay, no_decay]`` of
        ``model`` (default: the trainer's, unwrapped), an empty one kept, split by ``get_decay_parameter_names``; the
        class and kwargs of ``optimizer_cls_and_kwargs`` or else ``self.get_optimizer_cls_and_kwargs(args, model)``
        (a subclass's override is used, and its ``params``/``optimizer_dict`` replace the groups)."""
        if self.optimizer is None:
            from ..optim.factory import build_param_groups, instantiate_optimizer

            opt_model = unwrap_model(self.model) if model is None else model
            groups = build_param_groups(opt_model, self.args.weight_decay,
                                        decay_names=self.get_decay_parameter_names(opt_model))
            if self.optimizer_cls_and_kwargs is not None:
                optimizer_cls, optimizer_kwargs = self.optimizer_cls_and_kwargs
            else:
                optimizer_cls, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            self.optimizer = instantiate_optimizer(optimizer_cls, optimizer_kwargs, groups, opt_model)
        return self.optimizer

    @staticmethod
    def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[Any, dict[str, Any]]:
        """``(optimizer_cls, optimizer_kwargs)`` for ``args.optim`` (``lr``, the Adam betas/epsilon, ``optim_args``;
        a low-rank optimizer's own groups under ``"params"``). ``create_optimizer`` calls it as
        ``self.get_optimizer_cls_and_kwargs(self.args, model)``, so a subclass may override it (also as an instance
        method) and return other kwargs, e.g. its own groups under ``"optimizer_dict"``."""
        from ..optim.factory import get_optimizer_cls_and_kwargs

        return get_optimizer_cls_and_kwargs(args, model)

    def create_scheduler(self, num_training_steps: int, optimizer: torch.optim.Optimizer | None = None) -> Any:
        """Build the schedule of ``args.lr_scheduler_type`` unless one was passed."""
        if self.lr_scheduler is None:
            from ..optim.schedules import trainer_scheduler

            self.lr_scheduler = trainer_scheduler(self.args, optimizer or self.optimizer, num_training_steps)
            self._created_lr_scheduler = True
        return self.lr_scheduler

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """``create_optimizer`` then ``create_scheduler``."""
        self.create_optimizer()
        # an override with the older signature create_scheduler(self, num_training_steps) gets no optimizer
        call_override(self, "create_scheduler", num_training_steps=num_training_steps, optimizer=self.optimizer)

    def _scheduler_needs_metrics(self) -> bool:
        from ..optim.greedy import GreedyLR

        return isinstance(self.lr_scheduler, (torch.optim.lr_scheduler.ReduceLROnPlateau, GreedyLR))

    # ------------------------------------------------------------------------------------------- the step
    def _prepare_input(self, data: Any) -> Any:
        """``data`` (tensors, nested in mappings, lists and tuples) on the device."""
        return self._tw_mover.move(data)

    def _prepare_inputs(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """Move a batch to the device (and feed back ``mems`` when ``past_index`` is set)."""
        if type(inputs) is dict and self._past is None:  # the common case: a flat dict from a collator
            return self._tw_mover.flat(inputs)
        if not isinstance(inputs, Mapping):
            raise TypeError(f"A batch must be a dict of tensors (got {type(inputs).__name__}); use a data_collator "
                            "that returns a mapping, e.g. default_data_collator")
        moved = self._prepare_input(inputs)
        if self.args.past_index >= 0 and self._past is not None:
            moved["mems"] = self._past
        return moved

    def _adopt_input_dtype(self) -> None:
        """Pick the batch mover of this run, once the backend built its engine (which may want its floating-point
        inputs in its dtype), so that the step itself has no dtype or device branch."""
        self._tw_mover = BatchMover(self.args.device, self.backend.input_dtype, nested=self._prepare_input)

    def compute_loss_context_manager(self) -> AbstractContextManager[Any]:
        """The context the forward pass runs in (mixed-precision autocast, or nothing)."""
        return self.backend.autocast()

    def autocast_smart_context_manager(self, cache_enabled: bool | None = True) -> AbstractContextManager[Any]:
        """Alias of :meth:`compute_loss_context_manager` kept for upstream compatibility."""
        return self.backend.autocast()

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any:
        """Forward ``inputs`` through ``model`` and return the loss (and the outputs when ``return_outputs``)."""
        labels = None
        loss: Any  # (an annotation only: no code on the step's path)
        if (self.label_smoother is not None or self.compute_loss_func is not None) and "labels" in inputs:
            labels = inputs.pop("labels")
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            inputs = {**inputs, "num_items_in_batch": num_items_in_batch}
        try:
            outputs = model(**inputs)
        except TypeError as err:
            explained = explain_rejected_labels(err, model, inputs, self.label_names)
            if explained is None:
                raise
            raise explained from err
        if self.args.past_index >= 0:
            self._past = outputs[self.args.past_index]
        if labels is not None and self.compute_loss_func is not None:
            loss = self.compute_loss_func(outputs, labels, num_items_in_batch=num_items_in_batch)
        elif labels is not None and self.label_smoother is not None:  # upstream's smoothing (a causal LM: shifted)
            loss = self.label_smoother(outputs, labels, shift_labels=is_causal_lm(model))
        else:  # a dict holding the loss tensor (the common case) is read here; anything else by extract_loss
            loss = outputs.get("loss") if type(outputs) is dict else None
            if type(loss) is not torch.Tensor:
                loss = extract_loss(outputs, inputs, self.label_names)
        if num_items_in_batch is not None and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None):
            loss = self._tw_scale_to_global_batch(model, loss, outputs if labels is None else None)
        return (loss, outputs) if return_outputs else loss

    def _tw_scale_to_global_batch(self, model: nn.Module, loss: torch.Tensor, outputs: Any) -> torch.Tensor:
        """A loss divided by ``num_items_in_batch`` (the items of every rank and micro-batch of the step), scaled so
        that the ranks' averaged gradients and the window's summed ones are the big batch's: with
        ``average_tokens_across_devices`` the count spans every rank and DDP averages, so the loss is multiplied
        back (upstream's ``loss_scale if n_gpu <= 1 else n_gpu``). A model's own router loss (``outputs``: the
        model's, None for a loss computed here) is a mean over its micro-batch instead: it is left out of the
        multiplication and divided over the window's micro-batches (upstream multiplies it, transformers#48690)."""
        average = bool(self.args.average_tokens_across_devices)
        scale = (self.args.world_size if self._tw_n_gpu <= 1 else self._tw_n_gpu) if average else 1
        from ..loops.loss_scaling import router_aux_term  # loaded with the loop, not by the import

        aux = None if outputs is None else router_aux_term(model, outputs)
        if aux is None:
            return loss * scale if scale != 1 else loss
        window = self._tw_run.loop.window_size if self.is_in_train and self._tw_run is not None else 1
        return (loss - aux) * scale + aux / window

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """Forward and backward on one micro-batch; returns the detached loss (already divided for accumulation)."""
        if not (model.training and self.model.training):  # as upstream's model.train() (a callback or a save, e.g.
            model.train()  # sentence-transformers' encode, left eval mode), without walking every module each step
        inputs = self._prepare_inputs(inputs)
        # An override written for the older upstream signature (no num_items_in_batch) still works; its loss is a
        # per-micro-batch mean, so it is divided like any other.
        cached, method = self._tw_loss_takes_items, self.compute_loss  # _compute_loss_takes_num_items' cache, inlined
        if cached is not None and cached[0] is getattr(method, "__func__", method):
            takes_items = cached[1]
        else:
            takes_items = self._compute_loss_takes_num_items()
        if self._tw_n_gpu > 1 and num_items_in_batch is not None:  # DataParallel: upstream's (n_gpu, 1) count
            from ..loops.loss_scaling import data_parallel_num_items

            num_items_in_batch = data_parallel_num_items(
                num_items_in_batch, self._tw_n_gpu,
                average_tokens_across_devices=bool(self.args.average_tokens_across_devices))
        with self.compute_loss_context_manager():
            if takes_items:
                loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
            else:
                loss = self.compute_loss(model, inputs)
        if self._tw_n_gpu > 1:
            loss = loss.mean()
        divisor = self.current_gradient_accumulation_steps
        if type(divisor) is not int or divisor != 1:  # (the int 1 of a one-batch window divides nothing)
            scaled = self.loss_is_scaled_for_ga
            if scaled is None:  # normalised over the whole window by num_items_in_batch (model or compute_loss_func)
                scaled = num_items_in_batch is not None and takes_items and self._needs_num_items_in_batch()
            if not scaled and (isinstance(divisor, torch.Tensor) or divisor != 1):  # no device sync for a tensor
                # a per-micro-batch mean: the loop sets the divisor so the window sums to the mean of one big batch
                loss = loss / divisor
        try:
            self.backend.backward(loss)
        except RuntimeError as err:
            explained = explain_backward_error(err, loss, type(self.model).__name__)
            if explained is None:
                raise
            raise explained from err
        return loss.detach()

    def _compute_loss_takes_num_items(self) -> bool:
        """Whether ``self.compute_loss`` (maybe a user override) accepts ``num_items_in_batch``."""
        method = self.compute_loss
        func = getattr(method, "__func__", method)
        cached = self._tw_loss_takes_items
        if cached is not None and cached[0] is func:  # per micro-batch: the answer of the same function is kept
            return cached[1]
        takes = accepts(self, "compute_loss").takes("num_items_in_batch")
        self._tw_loss_takes_items = (func, takes)
        return takes

    def _needs_num_items_in_batch(self) -> bool:
        return self.model_accepts_loss_kwargs or self.compute_loss_func is not None

    def _tw_run_parts(self) -> RunParts:
        """The Trainer's own parts a training run uses, handed to it by :meth:`train` (the loops read no Trainer
        internals)."""
        from ..loops.contract import RunParts

        return RunParts(checkpoints=self._tw_checkpoints, flops_counter=self._flops_counter,
                        count_input_tokens=self._count_input_tokens,
                        scheduler_needs_metrics=self._scheduler_needs_metrics,
                        compute_loss_takes_num_items=self._compute_loss_takes_num_items,
                        adopt_input_dtype=self._adopt_input_dtype, register=self._tw_register_run)

    def _tw_register_run(self, run: TrainingRun) -> None:
        self._tw_run = run

    def _count_input_tokens(self, inputs: Mapping[str, Any], *, non_padding: bool = False) -> int:
        """Tokens of one micro-batch for ``include_num_input_tokens_seen`` (elements of the main input); with
        ``non_padding`` (its ``"non_padding"`` mode) as upstream: the ``attention_mask``'s sum, else the elements
        that are not the processing class's ``pad_token_id``, else all."""
        main = inputs.get(getattr(self.model, "main_input_name", "input_ids"))
        if not isinstance(main, torch.Tensor):
            return 0
        if non_padding:
            mask = inputs.get("attention_mask")
            if isinstance(mask, torch.Tensor):
                return int(mask.sum())
            pad_id = getattr(self.processing_class, "pad_token_id", None)
            if pad_id is not None:
                return int((main != pad_id).sum())
        return int(main.numel())

    def _flops_counter(self) -> Callable[[Any], int]:
        """What the training loop calls per micro-batch for its FLOPs, read once per run: the rule for this model,
        unless ``floating_point_ops`` is overridden (then the override)."""
        method = self.floating_point_ops
        if getattr(method, "__func__", None) is not Trainer.floating_point_ops:
            return method
        model = self.model
        if self._tw_flops_owner is not model:
            self._tw_flops_owner, self._tw_flops_rule = model, flops_rule(model)
        return self._tw_flops_rule

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """FLOPs of one forward+backward: the model's own estimate, else 6 x parameters x items (tokens or rows)."""
        model = self.model  # always the unwrapped module
        if self._tw_flops_owner is not model:  # the rule is picked once per model (nn.Module attribute misses are slow)
            self._tw_flops_owner, self._tw_flops_rule = model, flops_rule(model)
        return self._tw_flops_rule(inputs)

    def num_examples(self, dataloader: Any) -> int:
        """Number of samples of a DataLoader's dataset (or batches x batch size when the dataset has no length)."""
        try:
            return len(dataloader.dataset)
        except (TypeError, AttributeError):
            return len(dataloader) * self.args.per_device_train_batch_size

    def num_tokens(self, train_dl: Any, max_steps: int | None = None) -> int:
        """Tokens (``input_ids`` elements) in the training data, for ``include_tokens_per_second``."""
        total = 0
        for step, batch in enumerate(train_dl):
            total += batch["input_ids"].numel() if "input_ids" in batch else 0
            if max_steps is not None and step + 1 >= max_steps * self.args.gradient_accumulation_steps:
                break
        return total

    # -------------------------------------------------------------------------------------------- training
    def call_model_init(self, trial: Any = None) -> nn.Module:
        """Call ``model_init`` (with the trial when it takes one)."""
        return call_model_init(self.model_init, trial, self.backend.model_init_context)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial: Any = None,
              ignore_keys_for_eval: list[str] | None = None, **kwargs: Any) -> TrainOutput:
        """Run training; ``resume_from_checkpoint=True`` continues from the newest complete checkpoint, ``"auto"``
        does the same when there is one and starts fresh otherwise, a path resumes from that checkpoint."""
        if "model_path" in kwargs:
            warnings.warn("`model_path` is deprecated, use `resume_from_checkpoint`", FutureWarning, stacklevel=2)
            resume_from_checkpoint = kwargs.pop("model_path")
        if kwargs:
            raise TypeError(f"train() got unexpected keyword arguments: {sorted(kwargs)}")
        self._apply_trial_params(trial)  # a dict of hyper-parameters (Ray Tune, W&B sweeps) sets the arguments
        self._memory_tracker.start()
        self.is_in_train = True
        if self.model_init is not None:
            enable_full_determinism(self.args.seed) if self.args.full_determinism else set_seed(self.args.seed)
            self._adopt_model(self.call_model_init(trial))
            self.optimizer, self.lr_scheduler = None, None
        if self._created_lr_scheduler:  # as upstream: a second train() gets a new schedule (the optimizer is kept)
            self.lr_scheduler, self._created_lr_scheduler = None, False
        resume_from = self._tw_checkpoints.resolve_resume(resume_from_checkpoint, trial=trial is not None)
        if self.args.train_batch_size != self._tw_requested_batch_size:  # new arguments (a hyperparameter search trial)
            self._train_batch_size = self._tw_requested_batch_size = self.args.train_batch_size
        from ..loops.run import TrainingRun, finish
        from ..loops.train_loop import run_training

        try:
            with self._tw_checkpoints.preemption_scope():
                if self.args.auto_find_batch_size:
                    from ..loops.batch_size import train_finding_batch_size

                    run = train_finding_batch_size(self, parts=self._tw_run_parts(), resume_from=resume_from,
                                                   trial=trial, ignore_keys_for_eval=ignore_keys_for_eval)
                else:
                    run = run_training(TrainingRun(self, parts=self._tw_run_parts(), resume_from=resume_from,
                                                   trial=trial, ignore_keys_for_eval=ignore_keys_for_eval))
                self.is_in_train = False
                output = finish(run)
        except IndexError as err:
            from ..data.length_check import explain_index_error

            explained = explain_index_error(err, self.train_dataset, "train")
            if explained is None:
                raise
            raise explained from err
        finally:
            self.is_in_train = False
            if self._tw_run is not None:
                self._tw_run.close()
            self._tw_checkpoints.release_output_dir()
            self._memory_tracker.stop("train")  # after an error too, so that a later train/evaluate is tracked
            from ..runtime.distributed import note_process_groups  # loaded by train(), not by the import

            note_process_groups()  # the mesh's and DeepSpeed's groups, released at exit even if the script destroys
        raise_if_preempted(self._tw_checkpoints, self.state.global_step, output)
        return output

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, grad_norm: torch.Tensor | float | None,
                                 model: nn.Module, trial: Any, epoch: float, ignore_keys_for_eval: list[str] | None,
                                 start_time: float | None = None, learning_rate: float | None = None) -> None:
        """Log, evaluate and save as ``self.control`` asks, in that order (see
        :func:`trainwell.loops.run.log_save_evaluate`); ``learning_rate``, when given, is the one logged."""
        control = self.control
        if control.should_log or control.should_evaluate or control.should_save:  # (most steps: none of them)
            from ..loops.run import log_save_evaluate

            log_save_evaluate(self._tw_run, tr_loss, grad_norm, model, trial, ignore_keys_for_eval, start_time,
                              learning_rate)

    def _get_learning_rate(self) -> float:
        if self._scheduler_needs_metrics() or self.lr_scheduler is None:
            if self.optimizer is None:
                raise RuntimeError("_get_learning_rate: the optimizer is not built (train() builds it)")
            return float(self.optimizer.param_groups[0]["lr"])
        return float(self.lr_scheduler.get_last_lr()[0])

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None,
                  skip_scheduler: bool = False) -> dict[str, float]:
        """Evaluate; a scheduler stepped by a metric (``reduce_lr_on_plateau``) then steps, unless
        ``skip_scheduler``."""
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        if self._scheduler_needs_metrics() and not skip_scheduler:
            key = self.args.metric_for_best_model or "loss"
            self.lr_scheduler.step(metric_value(metrics, key))
        return metrics

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any) -> bool:
        """Record ``metrics``' ``metric_for_best_model`` in ``state.best_metric`` / ``best_global_step`` when it
        improves on the best so far; True then (a missing metric is a ``KeyError`` naming the available ones)."""
        return is_new_best(self.args, self.state, metrics)

    def _get_output_dir(self, trial: Any) -> str:
        """The run's output folder: ``args.output_dir``, which a hyper-parameter trial's arguments already point
        at its own ``run-<id>`` folder."""
        return require_output_dir(self.args.output_dir)

    def store_flos(self) -> None:
        """Add the FLOPs counted since the last call to ``state.total_flos``: every rank's, as upstream (a
        collective when several processes train: every rank calls it at the same log, save and end of training)."""
        from ..runtime.distributed import sum_across_ranks

        self.state.total_flos += sum_across_ranks(self.current_flos, self.args.device)
        self.current_flos = 0.0

    # ------------------------------------------------------------------------------------------- logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Record ``logs`` in ``state.log_history`` (with epoch and step) and send them to the callbacks."""
        if self.state.epoch is not None:
            logs["epoch"] = self.state.epoch
        if tokens_seen_mode(self.args.include_num_input_tokens_seen) != "no":
            logs["num_input_tokens_seen"] = self.state.num_input_tokens_seen
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.control = self.callback_handler.on_log(self.args, self.state, self.control, logs)

    def is_local_process_zero(self) -> bool:
        """True on the first process of each node."""
        return self.args.local_process_index == 0

    def is_world_process_zero(self) -> bool:
        """True on the first process of the whole job."""
        return self.args.process_index == 0

    def metrics_format(self, metrics: dict[str, float]) -> dict[str, Any]:
        """Metrics formatted for humans (runtimes as h:mm:ss, memory in MB, flos in GF)."""
        return reporting.metrics_format(metrics)

    def log_metrics(self, split: str, metrics: dict[str, float]) -> None:
        """Print ``metrics`` of ``split`` as an aligned table (main process only)."""
        if self.is_world_process_zero():
            print(reporting.format_metrics_table(split, metrics))

    def save_metrics(self, split: str, metrics: dict[str, float], combined: bool = True) -> None:
        """Write ``{split}_results.json`` (and merge into ``all_results.json``) in ``output_dir``."""
        if self.is_world_process_zero():
            reporting.save_metrics_json(require_output_dir(self.args.output_dir), split, metrics, combined=combined)

    def save_state(self) -> None:
        """Write ``trainer_state.json`` in ``output_dir``."""
        if self.is_world_process_zero():
            output_dir = require_output_dir(self.args.output_dir)
            os.makedirs(output_dir, exist_ok=True)
            self.state.save_to_json(Path(output_dir) / "trainer_state.json")

    # ------------------------------------------------------------------------------------------- evaluation
    # Upstream's method names (users override them), each delegating to trainwell.loops.eval_loop.
    def get_eval_dataloader(self, eval_dataset: Dataset | str | None = None) -> Any:
        """The evaluation DataLoader (sequential); ``eval_dataset`` may be a dataset or the name of one of a dict."""
        return eval_loop.eval_dataloader(self, eval_dataset)

    def get_test_dataloader(self, test_dataset: Dataset) -> Any:
        """The prediction DataLoader for ``test_dataset`` (sequential)."""
        return eval_loop.prediction_dataloader(self, test_dataset)

    def evaluate(self, eval_dataset: Dataset | dict[str, Dataset] | str | None = None,
                 ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Run evaluation and return the metrics (loss, compute_metrics results, speed, epoch), all prefixed.

        A dict of datasets (passed here or given to the Trainer) evaluates each one with the prefix
        ``f"{metric_key_prefix}_{name}"`` and returns the merged metrics.
        """
        return eval_loop.run_evaluate(self, eval_dataset, ignore_keys, metric_key_prefix)

    def predict(self, test_dataset: Dataset, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions (padded with -100 when lengths differ), label ids and metrics (when labels are present)."""
        return eval_loop.run_predict(self, test_dataset, ignore_keys, metric_key_prefix)

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """The loop shared by ``evaluate`` and ``predict``; works with or without labels.

        Returns numpy predictions / label ids (nested like the model's outputs), prefixed metrics and the
        number of samples (``len(dataset)``, or the count seen while iterating a dataset without ``__len__``).
        """
        return eval_loop.run_evaluation(self, dataloader, description, prediction_loss_only=prediction_loss_only,
                                        ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix,
                                        model=self._model_for_eval())

    def prediction_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """Upstream's legacy loop (``use_legacy_prediction_loop=True`` calls it): the same as ``evaluation_loop``."""
        return self.evaluation_loop(dataloader, description, prediction_loss_only=prediction_loss_only,
                                    ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """One evaluation step: ``(loss, logits, labels)``, each optional (see
        :func:`trainwell.loops.eval_loop.prediction_step`)."""
        return eval_loop.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    # ------------------------------------------------------------------------------------------- evaluation glue
    def _model_for_eval(self) -> nn.Module:
        """The model to run inference with: on the device, cast for ``fp16/bf16_full_eval`` outside training."""
        return model_for_eval(self)

    def hyperparameter_search(self, hp_space: Callable[[Any], dict[str, Any]] | None = None,
                              compute_objective: Callable[[dict[str, float]], Any] | None = None,
                              n_trials: int = 20, direction: str | list[str] = "minimize", backend: Any = None,
                              hp_name: Callable[[Any], str] | None = None, **kwargs: Any) -> Any:
        """Search hyper-parameters with Optuna; returns the best ``BestRun`` (a list of them for several directions).

        Needs ``model_init``. ``hp_space(trial)`` returns TrainingArguments overrides; each trial trains under
        ``output_dir/run-<n>``, evaluates, and scores ``compute_objective(metrics)``; evaluations during training
        feed the study's pruner. ``kwargs`` go to ``optuna.create_study`` (sampler, pruner, study_name, storage)
        and ``Study.optimize`` (timeout...). The arguments and state are restored afterwards. See
        :mod:`trainwell.hpsearch`.
        """
        from ..hpsearch import run_hyperparameter_search

        return run_hyperparameter_search(self, hp_space=hp_space, compute_objective=compute_objective,
                                         n_trials=n_trials, direction=direction, backend=backend, hp_name=hp_name,
                                         scope=self._tw_search_scope, **kwargs)

    # --------------------------------------------------------- checkpoints (the trainer.checkpointing.checkpoints part)
    def _save_checkpoint(self, model: nn.Module, trial: Any, tr_loss: torch.Tensor | None = None) -> Path:
        """Write ``checkpoint-<global_step>`` atomically (every resumable state), then rotate old ones."""
        return self._tw_checkpoints.save(model, trial, tr_loss=tr_loss,
                                         loop=self._tw_run.loop if self._tw_run is not None else None)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model weights (``model.safetensors``, sharded above 5GB), the arguments and the processing class.

        A model with ``save_pretrained`` (a transformers model) is saved with it, config included.
        """
        save_load_defaults.save_model(self._tw_checkpoints, output_dir, _internal_call=_internal_call)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        """Write the weights, config, processing class (else ``data_collator.tokenizer``) and ``training_args.bin``
        into ``output_dir``; ``save_model`` and every checkpoint call it (a checkpoint's into its temporary folder,
        which is then checksummed and committed, whatever files an override writes)."""
        save_load_defaults.write_model_files(
            self._tw_checkpoints, require_output_dir(self.args.output_dir if output_dir is None else output_dir),
            state_dict)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """Write ``optimizer.pt`` and ``scheduler.pt`` into a checkpoint's (temporary) folder ``output_dir``."""
        save_load_defaults.save_optimizer_and_scheduler(self._tw_checkpoints, output_dir)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None:
        """Load the model weights of the checkpoint folder ``resume_from_checkpoint`` (into ``model`` if given); a
        peft model's adapters with ``load_adapter(..., is_trainable=True)``. A resume calls it."""
        save_load_defaults.load_weights(self._tw_checkpoints, resume_from_checkpoint, model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Load the optimizer and scheduler states of ``checkpoint`` (validated first); a resume calls it."""
        save_load_defaults.load_optimizer_and_scheduler(self._tw_checkpoints, checkpoint)

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """Restore this process's random streams from ``checkpoint``; a resume calls it."""
        save_load_defaults.load_rng_state(self._tw_checkpoints, checkpoint)

    def _load_best_model(self) -> None:
        """Reload the weights of ``state.best_model_checkpoint`` (``load_best_model_at_end``)."""
        save_load_defaults.load_best_model(self._tw_checkpoints)

    def _sorted_checkpoints(self, output_dir: str | None = None, checkpoint_prefix: str = PREFIX_CHECKPOINT_DIR,
                            use_mtime: bool = False) -> list[str]:
        """trainwell's complete checkpoints in ``output_dir``, oldest first, the best one kept off the front."""
        return self._tw_checkpoints.sorted_checkpoints(output_dir, checkpoint_prefix, use_mtime=use_mtime)

    def _rotate_checkpoints(self, use_mtime: bool = False, output_dir: str | None = None) -> None:
        """Delete the oldest of trainwell's checkpoints beyond ``save_total_limit`` (never the best one)."""
        self._tw_checkpoints.rotate(output_dir, use_mtime=use_mtime)

    @property
    def preempted(self) -> bool:
        """Whether the last ``train()`` stopped on SIGTERM/SIGINT (after saving a checkpoint)."""
        return self._tw_checkpoints.preempted

    @property
    def preempted_by(self) -> str | None:
        """The name of the signal that stopped the last ``train()`` (``"SIGTERM"``), else None."""
        return self._tw_checkpoints.preempted_by

    @property
    def preemption_sync_steps(self) -> int:
        """With several processes, the ranks agree on a stop every this many optimizer steps (default 10)."""
        return self._tw_checkpoints.preemption_sync_steps

    @preemption_sync_steps.setter
    def preemption_sync_steps(self, value: int) -> None:
        self._tw_checkpoints.preemption_sync_steps = value

    # --------------------------------------------------------------------------------- hub (trainer.hub part)
    def _tw_hub_part(self) -> TrainerHub:
        if self._tw_hub is None:
            from .hub import TrainerHub

            self._tw_hub = TrainerHub(self)
        return self._tw_hub

    @property
    def hub_model_id(self) -> str | None:
        """The hub repository ``init_hf_repo`` created (None before)."""
        return self._tw_hub.model_id if self._tw_hub is not None else None

    @hub_model_id.setter
    def hub_model_id(self, value: str | None) -> None:
        self._tw_hub_part().model_id = value

    @property
    def push_in_progress(self) -> Any:
        """The checkpoint pushes running in the background (``is_done()``, ``wait_until_done()``), or None."""
        return self._tw_hub.push_in_progress if self._tw_hub is not None else None

    def init_hf_repo(self, token: str | None = None, private: bool | None = None) -> None:
        """Create (or reuse) the hub repository ``args.hub_model_id`` (default: ``output_dir``'s name)."""
        self._tw_hub_part().init_repo(token=token, private=private)

    def create_model_card(self, language: str | None = None, license: str | None = None,
                          tags: str | list[str] | None = None, model_name: str | None = None,
                          finetuned_from: str | None = None, tasks: str | list[str] | None = None,
                          dataset_tags: str | list[str] | None = None, dataset: str | list[str] | None = None,
                          dataset_args: str | list[str] | None = None) -> None:
        """Write ``output_dir/README.md``: metadata, the training hyper-parameters and the evaluation results."""
        self._tw_hub_part().create_model_card(language=language, license=license, tags=tags, model_name=model_name,
                                      finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags,
                                      dataset=dataset, dataset_args=dataset_args)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True,
                    token: str | None = None, revision: str | None = None, private: bool | None = None,
                    **kwargs: Any) -> Any:
        """Save the model and upload ``output_dir`` (no checkpoints) with a model card to ``hub_model_id``.

        Returns the ``CommitInfo`` (a future of it with ``blocking=False``); None on the other processes.
        ``kwargs`` go to :meth:`create_model_card`.
        """
        return self._tw_hub_part().push_to_hub(commit_message=commit_message, blocking=blocking, token=token,
                                       revision=revision, private=private, **kwargs)

    def _push_from_checkpoint(self, checkpoint_folder: str | os.PathLike) -> None:
        """After a checkpoint save: copy its model files to ``output_dir`` and push in the background."""
        if self.args.push_to_hub:
            self._tw_hub_part().push_from_checkpoint(checkpoint_folder)

    def _finish_current_push(self) -> None:
        """Wait for a running background push (end of training, before a final push)."""
        if self._tw_hub is not None:
            self._tw_hub.finish_current_push()

    # ------------------------------------------------------------------------ upstream compatibility surface
    def end(self) -> None:
        """Finish the run: close the distributed process group (as upstream's ``Trainer.end``, which ends
        accelerate's trackers, none of which a Trainer starts, and destroys the group).

        Call it once, last in the script: ``train``, ``evaluate``, ``predict``, ``save_model`` and ``push_to_hub``
        communicate between the processes and fail once the group is gone. Without a process group (one process)
        it does nothing."""
        from ..runtime.distributed import destroy_process_group

        destroy_process_group()

    @property
    def accelerator(self) -> TrainerAccelerator:
        """An object answering the ``accelerate.Accelerator`` calls user code makes (``gather``,
        ``is_main_process``, ``unwrap_model``, ``wait_for_everyone``, ``backward``, ``device``...)."""
        if self._tw_accelerator is None:
            from .accelerator import TrainerAccelerator

            self._tw_accelerator = TrainerAccelerator(self)
        return self._tw_accelerator

    @property
    def deepspeed(self) -> Any:
        """The DeepSpeed engine (``trainer.deepspeed.save_checkpoint(dir)``); None before training or without
        ``deepspeed=``."""
        return self.backend.engine

    @property
    def is_deepspeed_enabled(self) -> bool:
        """True when ``args.deepspeed`` is set."""
        return self.args.deepspeed is not None

    @property
    def is_fsdp_enabled(self) -> bool:
        """True when ``args.fsdp`` is set."""
        return bool(self.args.fsdp)

    def get_tp_size(self) -> int:
        """The tensor-parallel degree: the model's ``_tp_size`` (a model loaded with a tensor-parallel plan), else
        DeepSpeed's ``tensor_parallel.autotp_size``, else 1 (trainwell runs no tensor parallelism of its own)."""
        from .upstream_calls import tensor_parallel_size

        return tensor_parallel_size(self.model, deepspeed=self.is_deepspeed_enabled)

    def get_num_trainable_parameters(self) -> int:
        """Number of parameters with ``requires_grad``."""
        from .upstream_calls import num_trainable_parameters

        return num_trainable_parameters(self.model)

    def get_learning_rates(self) -> list[float]:
        """The learning rate of each parameter group of the optimizer."""
        from .upstream_calls import learning_rates

        return learning_rates(self.optimizer)

    def get_optimizer_group(self, param: nn.Parameter | str | None = None) -> Any:
        """The group (a dict) of the optimizer holding ``param``; without it, each group's parameter list (upstream's
        return value). Raises ``ValueError`` before the optimizer is built."""
        from .upstream_calls import optimizer_group

        return optimizer_group(self.optimizer, param)

    def _apply_trial_params(self, trial: Any) -> None:
        """``train(trial=<dict>)``: set each hyper-parameter on the arguments, as upstream does for Ray/W&B trials
        (a validated copy; a name the Trainer reads only when it is built is refused with an error naming it)."""
        from .upstream_calls import trial_arguments_from

        args = trial_arguments_from(self.args, trial)
        if args is not None:
            self._adopt_arguments(args)

    def _adopt_arguments(self, args: TrainingArguments) -> None:
        """Train from now on with ``args`` (a trial's): its own checkpoint part (its ``output_dir``), label smoother
        and backend, as upstream's ``_hp_search_setup`` builds a new Accelerator (and GradScaler) per trial; the
        previous backend's engine, wrapped model and optimizer are dropped first, with their device memory."""
        from ..backends import build_backend
        from ..loops.batch_size import release_device_memory

        self.args = args
        self._tw_checkpoints = self._tw_checkpoints.renewed(args)
        self.label_smoother = _label_smoother(args, self.model)
        self.backend, self.model_wrapped = None, self.model
        if self.model_init is not None:  # train() builds a new model: the old one's optimizer goes
            self.optimizer = self.lr_scheduler = None
        release_device_memory()
        self.backend = build_backend(args)

    @contextmanager
    def _tw_search_scope(self, *, without_model: bool = False) -> Iterator[None]:
        """A hyper-parameter search: its trials replace the arguments, backend, model, state... which are all put
        back when the block ends; ``without_model``: no model inside the block (Ray pickles the Trainer to its
        workers, and ``model_init`` makes each trial's model there)."""
        saved = {name: self.__dict__[name] for name in _SEARCH_REPLACES if name in self.__dict__}
        handler = self.callback_handler
        on_handler = (handler.model, handler.optimizer, handler.lr_scheduler, list(handler.callbacks))
        if without_model:
            self.model = self.model_wrapped = None  # type: ignore[assignment]
        try:
            yield
        finally:
            self.__dict__.update(saved)
            handler.model, handler.optimizer, handler.lr_scheduler, handler.callbacks = on_handler
