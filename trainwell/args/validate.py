"""What ``TrainingArguments.__post_init__`` does: convert strings to enums, map deprecated spellings (with a
``FutureWarning``), fill derived defaults and raise ``ValueError`` naming the field and the fix.

Also the vocabulary the checks use (log levels, debug words, compile modes...). Nothing here touches process
groups; the one outside effect is upstream's: once the process has imported accelerate, its ``PartialState`` is set
up in a single process (:func:`trainwell.runtime.accelerate_env.ensure_partial_state`).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import socket
import sys
import warnings
from dataclasses import fields
from datetime import datetime
from enum import Enum
from typing import Any, overload

from ..utils.option_enums import (
    ExplicitEnum,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
    ShardedDDPOption,
)
from ..utils.preflight import coerce_field_types
from .data_options import check_parallelism_config, resolve_data_options
from .field_types import FieldTypes
from ..utils.trackers import REPORT_TO_INTEGRATIONS, get_available_reporting_integrations, is_kubeflow_available

logger = logging.getLogger(__name__)

# upstream's levels (transformers.utils.logging.log_levels plus "passive"), "detail" included (DEBUG)
trainer_log_levels: dict[str, int] = {
    "detail": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
    "error": logging.ERROR, "critical": logging.CRITICAL, "passive": -1,
}

INCLUDE_FOR_METRICS = ("inputs", "loss")
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DDP_BACKENDS = ("nccl", "gloo", "mpi", "ccl", "hccl", "cncl", "mccl")
_DICT_FIELDS = ("lr_scheduler_kwargs", "fsdp_config", "accelerator_config", "deepspeed",
                "gradient_checkpointing_kwargs", "activation_checkpointing_kwargs", "liger_kernel_config")
_FILE_DICT_FIELDS = ("fsdp_config", "accelerator_config", "deepspeed")
# deprecated field -> (replacement field, the deprecated field's "unset" value)
_RENAMED: dict[str, tuple[str, Any]] = {
    "evaluation_strategy": ("eval_strategy", None),
    "per_gpu_train_batch_size": ("per_device_train_batch_size", None),
    "per_gpu_eval_batch_size": ("per_device_eval_batch_size", None),
    "no_cuda": ("use_cpu", False),
    "fp16_backend": ("half_precision_backend", "auto"),
    "torchdynamo": ("torch_compile_backend", None),
    "push_to_hub_model_id": ("hub_model_id", None),
    "push_to_hub_token": ("hub_token", None),
}


class DebugOption(ExplicitEnum):
    """Words accepted by ``--debug``."""

    UNDERFLOW_OVERFLOW = "underflow_overflow"
    TPU_METRICS_DEBUG = "tpu_metrics_debug"


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated and will be removed in a future version; use `{new}` instead.",
                  FutureWarning, stacklevel=4)


def _deprecated_checkpointing(old: str, new: str) -> None:
    """Upstream 5.24's FutureWarning for the ``gradient_checkpointing*`` aliases."""
    warnings.warn(f"`{old}` is deprecated and will be removed in v6. Use `{new}` instead.", FutureWarning,
                  stacklevel=4)


def _to_enum(cls: type[Enum], value: Any, name: str) -> Any:
    """``cls(value)`` with an error naming the field and listing the valid values."""
    try:
        return cls(value.value if isinstance(value, Enum) else value)
    except ValueError:
        valid = [m.value for m in cls]
        raise ValueError(f"{name}={value!r} is not valid; choose one of {valid}.") from None


def _to_enum_list(cls: type[Enum], value: Any, name: str) -> list[Any]:
    """A space-separated string or a list of words -> a list of enum members."""
    if value is None:
        return []
    words = value.split() if isinstance(value, str) else list(value)
    return [_to_enum(cls, w, name) for w in words]


def _load_json(name: str, value: str) -> Any:
    """A JSON object string (starts with ``{``) or a path to a JSON file, loaded."""
    if value.strip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"{name} is not valid JSON ({err}); pass a dict or a JSON object string.") from None
    if name not in _FILE_DICT_FIELDS:
        raise ValueError(f"{name}={value!r} must be a dict or a JSON object string such as '{{\"key\": 1}}'.")
    if not os.path.isfile(value):
        raise ValueError(f"{name}={value!r}: file not found; pass an existing JSON file path or a dict.")
    try:
        with open(value, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise ValueError(f"{name} file {value!r} is not valid JSON: {err}") from None


@overload
def _normalise_steps(name: str, value: float) -> float: ...
@overload
def _normalise_steps(name: str, value: None) -> None: ...
def _normalise_steps(name: str, value: float | None) -> int | float | None:
    """A step count (int) or a ratio of the total training steps (float in (0, 1))."""
    if value is None:
        return None
    if value < 0:
        raise ValueError(f"{name}={value} must be >= 0: a number of steps, or a ratio in (0, 1) of the run.")
    if 0 < value < 1:
        return float(value)
    if value != int(value):
        raise ValueError(f"{name}={value} must be an integer when >= 1 (or a ratio in (0, 1) of the run).")
    return int(value)


def _parsed_dict(name: str, value: dict | str | None) -> dict:
    """A dict field read after ``_parse_dict_fields`` (which loads a JSON string or file): the dict, {} for None."""
    if isinstance(value, str):  # only a subclass skipping _parse_dict_fields could leave one
        raise ValueError(f"{name}={value!r} was not parsed: pass a dict or a JSON object string.")
    return value or {}


def _normalise_report_to(value: Any) -> list[str]:
    """``"all"`` / ``"none"`` / a name / a list of names -> the list of integrations to report to."""
    if value is None:
        return []
    names = value.replace(",", " ").split() if isinstance(value, str) else [str(v) for v in value]
    valid = ["all", "none", *REPORT_TO_INTEGRATIONS]
    bad = [n for n in names if n not in valid]
    if bad:
        raise ValueError(f"report_to has unknown integration(s) {bad}; choose from {valid}.")
    if "none" in names:
        if len(names) > 1:
            raise ValueError(f"report_to={names} mixes 'none' with integrations; pass 'none' alone.")
        return []
    if "all" in names:
        return get_available_reporting_integrations()
    return list(dict.fromkeys(names))


def _runs_on_cpu(use_cpu: bool) -> bool:
    """Whether this process would train on the CPU (no CUDA or MPS device, or ``use_cpu``)."""
    if use_cpu:
        return True
    import torch

    mps = getattr(torch.backends, "mps", None)
    return not torch.cuda.is_available() and not (mps is not None and mps.is_available())


class ArgumentValidation(FieldTypes):
    """The ``__post_init__`` of :class:`~trainwell.TrainingArguments`, one method per concern (subclasses such as
    ``TFTrainingArguments`` extend a step with ``super()``)."""

    def __post_init__(self) -> None:
        self._check_empty_cache_steps()
        coerce_field_types(self)  # "1e-3" -> 1e-3 as the parser would; a TypeError naming the field otherwise
        self._apply_deprecations()
        self._normalise_paths()
        self._convert_enums()
        self._parse_dict_fields()
        self._resolve_activation_checkpointing()
        self._check_numbers()
        self._resolve_data_loading()
        self._resolve_step_intervals()
        self._resolve_best_model()
        self._check_precision()
        self._resolve_sharded_ddp()
        self._resolve_fsdp()
        self._check_deepspeed()
        self.report_to = _normalise_report_to(self.report_to)
        if is_kubeflow_available() and "kubeflow" not in self.report_to:  # as upstream: a TrainJob gets its progress
            self.report_to = [*self.report_to, "kubeflow"]
        self._resolve_misc()
        self._tf32_for_compile()
        if "accelerate" in sys.modules:  # upstream builds accelerate's PartialState here (see ensure_partial_state)
            from ..runtime.accelerate_env import ensure_partial_state

            ensure_partial_state(self)

    def _check_empty_cache_steps(self) -> None:
        """Upstream 5.2x's rule, before any text is converted: a value given as a number must be an ``int`` (not a
        bool, not a float such as 2.0) bigger than 0; command-line text ("4") is converted, then checked the same."""
        value = self.torch_empty_cache_steps
        if value is None or isinstance(value, str):
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"torch_empty_cache_steps must be a positive integer (an int bigger than 0), or None to "
                             f"never empty the cache; got torch_empty_cache_steps={value!r}.")

    def _resolve_activation_checkpointing(self) -> None:
        """Upstream 5.24's rule (``TrainingArguments.__post_init__``): ``gradient_checkpointing*`` are deprecated
        aliases of ``activation_checkpointing*``, used only when the new name is unset; then the old names mirror the
        new ones (code reading them keeps working) and an unset ``activation_checkpointing`` is False."""
        for old, new in (("gradient_checkpointing", "activation_checkpointing"),
                         ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs")):
            if getattr(self, new) is None and getattr(self, old) is not None:
                _deprecated_checkpointing(old, new)
                setattr(self, new, getattr(self, old))
            setattr(self, old, getattr(self, new))
        if self.activation_checkpointing is None:
            self.activation_checkpointing = self.gradient_checkpointing = False

    def _apply_deprecations(self) -> None:
        for old, (new, unset) in _RENAMED.items():
            value = getattr(self, old)
            if value is not None and value != unset:
                _deprecated(old, new)
                setattr(self, new, value)
                setattr(self, old, unset)
        if self.use_mps_device:
            _deprecated("use_mps_device", "nothing (MPS is picked automatically)")
            self.use_mps_device = False
        if self.adafactor:
            _deprecated("adafactor", "optim='adafactor'")
            self.optim, self.adafactor = OptimizerNames.ADAFACTOR, False
        if self.include_inputs_for_metrics:
            _deprecated("include_inputs_for_metrics", "include_for_metrics=['inputs']")
            self.include_for_metrics = list(dict.fromkeys([*self.include_for_metrics, "inputs"]))
            self.include_inputs_for_metrics = False
        if self.tpu_metrics_debug:
            _deprecated("tpu_metrics_debug", "debug='tpu_metrics_debug'")
            extra = [DebugOption.TPU_METRICS_DEBUG]
            self.debug = (self.debug.split() if isinstance(self.debug, str) else list(self.debug)) + extra
            self.tpu_metrics_debug = False
        if self.push_to_hub_organization is not None:
            _deprecated("push_to_hub_organization", "hub_model_id='organization/name'")
            name = self.hub_model_id or os.path.basename(os.path.normpath(self.output_dir or "trainer_output"))
            self.hub_model_id, self.push_to_hub_organization = f"{self.push_to_hub_organization}/{name}", None
        if self.half_precision_backend in ("amp", "cuda_amp"):
            self.half_precision_backend = "auto"  # torch.amp is what "auto" picks

    def _normalise_paths(self) -> None:
        if self.output_dir is None:
            self.output_dir = "trainer_output"
        self.output_dir = os.path.expanduser(os.fspath(self.output_dir))
        if self.logging_dir is None:
            stamp = datetime.now().strftime("%b%d_%H-%M-%S")
            self.logging_dir = os.path.join(self.output_dir, "runs", f"{stamp}_{socket.gethostname()}")
        self.logging_dir = os.path.expanduser(os.fspath(self.logging_dir))
        env_local_rank = int(os.environ.get("LOCAL_RANK", -1) or -1)
        if env_local_rank != -1:  # the launcher's value wins over a stale --local_rank
            self.local_rank = env_local_rank

    def _convert_enums(self) -> None:
        self.eval_strategy = _to_enum(IntervalStrategy, self.eval_strategy, "eval_strategy")
        self.logging_strategy = _to_enum(IntervalStrategy, self.logging_strategy, "logging_strategy")
        self.save_strategy = _to_enum(SaveStrategy, self.save_strategy, "save_strategy")
        self.hub_strategy = _to_enum(HubStrategy, self.hub_strategy, "hub_strategy")
        self.lr_scheduler_type = _to_enum(SchedulerType, self.lr_scheduler_type, "lr_scheduler_type")
        self.optim = _to_enum(OptimizerNames, self.optim, "optim")
        self.debug = _to_enum_list(DebugOption, self.debug, "debug")
        for f in fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices is not None and value is not None and not isinstance(value, (list, Enum)):
                if value not in choices:
                    raise ValueError(f"{f.name}={value!r} is not valid; choose one of {list(choices)}.")

    def _parse_dict_fields(self) -> None:
        """JSON strings of the dict fields -> dicts. ``_VALID_DICT_FIELDS`` (upstream's class attribute, which the
        configs of TRL and sentence-transformers extend with their own dict fields) names them; a subclass's own
        field is parsed only when its string is a JSON object (``{...}``), as upstream does, since it may also
        accept a plain string (sentence-transformers' ``prompts``)."""
        for name in dict.fromkeys([*_DICT_FIELDS, *type(self)._VALID_DICT_FIELDS]):
            value = getattr(self, name, None)
            if not isinstance(value, str):
                continue
            if name not in _DICT_FIELDS:
                if value.strip().startswith("{"):
                    setattr(self, name, _load_json(name, value))
                continue
            loaded = _load_json(name, value)
            # a DeepSpeed config file stays a path: the backend reads it (and may rewrite "auto" values)
            setattr(self, name, value if name == "deepspeed" and not value.strip().startswith("{") else loaded)
        if self.lr_scheduler_kwargs is None:
            self.lr_scheduler_kwargs = {}

    def _check_numbers(self) -> None:
        checks = [
            (self.per_device_train_batch_size < 1, "per_device_train_batch_size must be a positive integer"),
            (self.per_device_eval_batch_size < 1, "per_device_eval_batch_size must be a positive integer"),
            (self.gradient_accumulation_steps < 1, "gradient_accumulation_steps must be >= 1 (1 disables it)"),
            (self.eval_accumulation_steps is not None and self.eval_accumulation_steps < 1,
             "eval_accumulation_steps must be >= 1, or None to keep every output on the device"),
            (self.learning_rate < 0, "learning_rate must be >= 0"),
            (self.weight_decay < 0, "weight_decay must be >= 0 (0 disables it)"),
            (not 0 <= self.adam_beta1 < 1, "adam_beta1 must lie in [0, 1)"),
            (not 0 <= self.adam_beta2 < 1, "adam_beta2 must lie in [0, 1)"),
            (self.warmup_steps < 0, "warmup_steps must be >= 0 (0: use warmup_ratio)"),
            # None: unset (sentence-transformers' default on transformers 5, which dropped the field)
            (not 0 <= (self.warmup_ratio or 0) <= 1, "warmup_ratio must lie in [0, 1]"),
            (self.max_steps == 0, "max_steps must be > 0, or -1 to train for num_train_epochs"),
            (self.num_train_epochs < 0, "num_train_epochs must be >= 0"),
            (not math.isfinite(self.num_train_epochs) and self.max_steps <= 0,
             "num_train_epochs must be a finite number of epochs (to train until stopped, set max_steps to a large "
             "number, or stop early with EarlyStoppingCallback)"),
            # upstream treats 0 (any value <= 0) as "no limit": a silent keep-everything, refused here
            (self.save_total_limit is not None and self.save_total_limit < 1,
             "save_total_limit must be >= 1; use None to keep every checkpoint (what upstream silently does for "
             "0), or save_strategy='no' to save none"),
            (not 0 <= self.label_smoothing_factor < 1, "label_smoothing_factor must lie in [0, 1)"),
            (self.dataloader_num_workers < 0, "dataloader_num_workers must be >= 0"),
            (self.dataloader_prefetch_factor is not None and self.dataloader_num_workers == 0,
             "dataloader_prefetch_factor needs dataloader_num_workers > 0 (loading in worker processes)"),
            (self.torch_empty_cache_steps is not None and self.torch_empty_cache_steps < 1,
             "torch_empty_cache_steps must be a positive integer (an int bigger than 0), or None to never empty the "
             "cache"),
            (self.dataloader_multiprocessing_context is not None and self.dataloader_num_workers == 0,
             "dataloader_multiprocessing_context needs dataloader_num_workers > 0 (a start method for worker "
             "processes; torch's DataLoader refuses it without workers)"),
        ]
        for failed, message in checks:
            if failed:  # each message starts with the name of the field it checks
                name = message.split(" ", 1)[0]
                raise ValueError(f"{message}; got {name}={getattr(self, name)!r}.")
        if self.warmup_steps > 0 and (self.warmup_ratio or 0) > 0:
            logger.warning("Both warmup_steps and warmup_ratio are set: warmup_steps wins.")

    def _resolve_data_loading(self) -> None:
        resolve_data_options(self)  # train_sampling_strategy, include_num_input_tokens_seen, ... (see .data_options)

    def _resolve_step_intervals(self) -> None:
        for name in ("logging_steps", "eval_steps", "save_steps", "warmup_steps"):
            setattr(self, name, _normalise_steps(name, getattr(self, name)))
        if self.logging_strategy == IntervalStrategy.STEPS and self.logging_steps == 0:
            raise ValueError("logging_strategy='steps' needs logging_steps > 0; set logging_steps or "
                             "use logging_strategy='no'/'epoch'.")
        if self.eval_strategy == IntervalStrategy.STEPS:
            if not self.eval_steps:  # None or 0 (upstream treats 0 as unset): use logging_steps
                if not self.logging_steps:
                    raise ValueError("eval_strategy='steps' needs eval_steps > 0 (or logging_steps > 0).")
                self.eval_steps = self.logging_steps
        if self.eval_strategy != IntervalStrategy.NO:
            self.do_eval = True

    def _resolve_best_model(self) -> None:
        on_metrics = self.lr_scheduler_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY)
        needs_metric = self.load_best_model_at_end or on_metrics
        if needs_metric and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if self.save_strategy == SaveStrategy.BEST:
            if self.metric_for_best_model is None:
                raise ValueError("`args.metric_for_best_model` must be provided when using 'best' save_strategy or if "
                                 "`args.load_best_model_at_end` is set to `True`: save_strategy='best' keeps the "
                                 "checkpoints that improve it; pass metric_for_best_model (e.g. 'eval_loss').")
            if self.eval_strategy == IntervalStrategy.NO:
                logger.warning("save_strategy='best' saves after evaluations, but eval_strategy='no'.")
        if self.load_best_model_at_end and self.save_strategy != SaveStrategy.BEST:
            self._check_best_model_intervals()
        if on_metrics and self.eval_strategy == IntervalStrategy.NO:
            raise ValueError(f"lr_scheduler_type={SchedulerType(self.lr_scheduler_type).value!r} steps on evaluation "
                             "metrics; set eval_strategy to 'steps' or 'epoch'.")

    def _check_best_model_intervals(self) -> None:
        # enums since _convert_enums, and eval_steps set (not None) by _resolve_step_intervals with 'steps'
        eval_strategy, save_strategy = IntervalStrategy(self.eval_strategy), SaveStrategy(self.save_strategy)
        if eval_strategy.value != save_strategy.value:
            raise ValueError("load_best_model_at_end needs save_strategy and eval_strategy to match; got "
                             f"eval_strategy={eval_strategy.value!r}, save_strategy={save_strategy.value!r}.")
        if eval_strategy != IntervalStrategy.STEPS:
            return
        save, every = self.save_steps, self.eval_steps
        assert every is not None
        if (save < 1) != (every < 1):
            raise ValueError("load_best_model_at_end needs save_steps to be a multiple of eval_steps, which "
                             "cannot be checked when mixing a ratio and a step count; use the same kind for both.")
        scale = 1_000_000 if save < 1 else 1  # compare ratios on an integer grid
        if round(save * scale) % round(every * scale) != 0:
            raise ValueError(f"load_best_model_at_end needs save_steps ({save}) to be a round multiple of "
                             f"eval_steps ({every}).")

    def _check_precision(self) -> None:
        if self.fp16 and self.bf16:
            raise ValueError("fp16=True and bf16=True: pick one mixed-precision mode (bf16 on Ampere GPUs/CPU).")
        if self.fp16_full_eval and self.bf16_full_eval:
            raise ValueError("fp16_full_eval=True and bf16_full_eval=True: pick one half-precision eval mode.")
        if self.fp16 and _runs_on_cpu(self.use_cpu):
            raise ValueError("fp16 mixed precision requires a GPU (or use bf16 on CPU): set fp16=False or "
                             "bf16=True" + (", or use_cpu=False" if self.use_cpu else "") + ".")
        if self.tf32 is not None:
            self._apply_tf32()

    def _tf32_for_compile(self) -> None:
        """``torch_compile`` turns TF32 on where the GPU has it, unless ``tf32`` or ``fp16`` says otherwise.

        Upstream rule (``TrainingArguments.__post_init__``, "TF32" step): with ``torch_compile``, ``enable_tf32(True)``
        when ``tf32 is None and not fp16 or bf16``, then an explicit ``tf32`` is applied over it; the net effect is
        TF32 on when ``tf32`` is unset and ``fp16`` is off (bf16 excludes fp16), as here."""
        if not (self.torch_compile and self.tf32 is None and not self.fp16):
            return
        import torch

        if torch.cuda.is_available() and torch.version.cuda is not None and torch.cuda.get_device_capability()[0] >= 8:
            logger.info("Setting TF32 in the CUDA backends to speed up torch_compile (tf32 unset; pass tf32=False to "
                        "keep float32 matmuls)")
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

    def _apply_tf32(self) -> None:
        import torch

        if not torch.cuda.is_available():
            if self.tf32:
                warnings.warn("tf32=True is ignored: TF32 needs an NVIDIA Ampere (or newer) GPU and none is "
                              "available.", UserWarning, stacklevel=4)
            return
        if torch.cuda.get_device_capability()[0] < 8:
            if self.tf32:
                raise ValueError("tf32=True needs an NVIDIA Ampere (or newer) GPU; set tf32=False or leave it unset.")
            return
        torch.backends.cuda.matmul.allow_tf32 = bool(self.tf32)
        torch.backends.cudnn.allow_tf32 = bool(self.tf32)

    def _resolve_sharded_ddp(self) -> None:
        raw = value = self.sharded_ddp
        value = "simple" if value is True else ("" if value in (False, None) else value)
        words = value.split() if isinstance(value, str) else list(value)
        # upstream 4.x also accepted "zero_dp_2 cpu_offload"
        names = ["offload" if word == "cpu_offload" else word for word in words]
        opts = _to_enum_list(ShardedDDPOption, names, "sharded_ddp")
        self.sharded_ddp = opts
        if not opts:
            return
        _deprecated("sharded_ddp", "fsdp (or sharded_ddp='simple' for DDP with ZeroRedundancyOptimizer)")
        if opts == [ShardedDDPOption.OFFLOAD] or opts == [ShardedDDPOption.AUTO_WRAP]:
            raise ValueError(f"sharded_ddp={raw!r}: offload/auto_wrap need zero_dp_2 or zero_dp_3.")
        if ShardedDDPOption.SIMPLE in opts:
            if len(opts) > 1:
                raise ValueError("sharded_ddp='simple' cannot be combined with other options.")
            return
        if ShardedDDPOption.ZERO_DP_2 in opts and ShardedDDPOption.ZERO_DP_3 in opts:
            raise ValueError("sharded_ddp: zero_dp_2 and zero_dp_3 exclude each other; pick one.")
        if self.fsdp:
            raise ValueError("sharded_ddp and fsdp are both set; use fsdp only.")
        shard = "full_shard" if ShardedDDPOption.ZERO_DP_3 in opts else "shard_grad_op"
        extra = [o.value for o in opts if o in (ShardedDDPOption.OFFLOAD, ShardedDDPOption.AUTO_WRAP)]
        self.fsdp, self.sharded_ddp = " ".join([shard, *extra]), []

    def _resolve_fsdp(self) -> None:
        value = self.fsdp
        value = "full_shard" if value is True else ("" if value in (False, None) else value)
        self.fsdp = _to_enum_list(FSDPOption, value, "fsdp")
        if self.fsdp == [FSDPOption.OFFLOAD]:
            raise ValueError("fsdp='offload' cannot work alone; add it to 'full_shard' or 'shard_grad_op'.")
        if FSDPOption.FULL_SHARD in self.fsdp and FSDPOption.SHARD_GRAD_OP in self.fsdp:
            raise ValueError("fsdp: 'full_shard' and 'shard_grad_op' exclude each other; pick one.")
        config = {(k[5:] if k.startswith("fsdp_") else k): v for k, v in _parsed_dict("fsdp_config", self.fsdp_config).items()}
        if self.fsdp_transformer_layer_cls_to_wrap is not None:
            _deprecated("fsdp_transformer_layer_cls_to_wrap", "fsdp_config['transformer_layer_cls_to_wrap']")
            config.setdefault("transformer_layer_cls_to_wrap", self.fsdp_transformer_layer_cls_to_wrap)
        if isinstance(config.get("transformer_layer_cls_to_wrap"), str):
            config["transformer_layer_cls_to_wrap"] = [config["transformer_layer_cls_to_wrap"]]
        config.setdefault("min_num_params", self.fsdp_min_num_params)
        if config["min_num_params"] > 0 and config.get("transformer_layer_cls_to_wrap"):
            raise ValueError("fsdp min_num_params and transformer_layer_cls_to_wrap are exclusive; keep one.")
        if not self.fsdp and (config["min_num_params"] > 0 or any(k != "min_num_params" for k in config)):
            logger.warning("fsdp_config / fsdp_min_num_params are ignored because fsdp is not set.")
        self.fsdp_config = config

    def _check_deepspeed(self) -> None:
        # a path was already checked (exists, valid JSON) by _parse_dict_fields
        if self.deepspeed is not None and self.fsdp:
            raise ValueError("fsdp and deepspeed are both set; use one sharding backend.")
        if self.deepspeed is not None:
            from ..backends.deepspeed.config import DeepSpeedConfig

            # As upstream: the config lives as long as these arguments, so is_deepspeed_zero3_enabled() (ours and
            # transformers') is True from here on and from_pretrained builds a ZeRO-3 model partitioned.
            self.hf_deepspeed_config = DeepSpeedConfig(self.deepspeed)
            self.hf_deepspeed_config.trainer_config_process(self)

    def _resolve_misc(self) -> None:
        bad = [x for x in self.include_for_metrics if x not in INCLUDE_FOR_METRICS]
        if bad:
            raise ValueError(f"include_for_metrics has {bad}; allowed values are {list(INCLUDE_FOR_METRICS)}.")
        for name in ("dispatch_batches", "split_batches"):
            if getattr(self, name) is not None:
                _deprecated(name, f"accelerator_config={{'{name}': ...}}")
                self.accelerator_config = {**_parsed_dict("accelerator_config", self.accelerator_config), name: getattr(self, name)}
                setattr(self, name, None)
        if self.torch_compile_backend is not None or self.torch_compile_mode is not None:
            self.torch_compile = True
        if self.torch_compile and self.torch_compile_backend is None:
            self.torch_compile_backend = "inductor"
        if self.disable_tqdm is None:
            # trainwell's own logger only (not transformers' verbosity, which a test suite or a script may have
            # turned down for its own reasons): the bars stay on unless trainwell was asked to be quiet
            level = trainer_log_levels[self.log_level]
            own = logging.getLogger("trainwell").level
            passive = own if own != logging.NOTSET else logging.WARNING
            self.disable_tqdm = (passive if level == -1 else level) > logging.WARNING
        if self.run_name is None:
            self.run_name = self.output_dir
        if self.use_cpu:  # as upstream: pinning needs an accelerator and only costs time on the CPU
            self.dataloader_pin_memory = False
        self._check_unimplemented()

    def _check_unimplemented(self) -> None:
        """Upstream switches trainwell cannot honour here: a clear error saying why and what to use instead.

        Each name of ``REFUSED_FIELDS`` is checked here and only here (tests/test_no_stub_fields.py holds the list
        to that: every other field is read by the library or is one of ``USER_SCRIPT_FIELDS``).
        """

        def missing(module: str) -> bool:
            return importlib.util.find_spec(module) is None

        checks = (
            ("use_ipex", self.use_ipex, "trainwell does not call intel_extension_for_pytorch (deprecated upstream; "
             "its CPU optimisations are in PyTorch itself): use bf16=True or torch_compile=True instead"),
            ("jit_mode_eval", self.jit_mode_eval, "torch.jit tracing for inference is deprecated in PyTorch and "
             "not done by trainwell: use torch_compile=True instead"),
            ("use_liger_kernel", self.use_liger_kernel and missing("liger_kernel"),
             "it needs the `liger-kernel` package (Triton kernels for CUDA): pip install liger-kernel, or leave it "
             "False"),
            ("tpu_num_cores", self.tpu_num_cores is not None and missing("torch_xla"),
             "TPUs need torch_xla, which is not installed: leave tpu_num_cores unset"),
            ("debug", DebugOption.TPU_METRICS_DEBUG in self.debug and missing("torch_xla"),
             "'tpu_metrics_debug' prints torch_xla metrics and torch_xla is not installed: drop it from debug"),
            ("mp_parameters", bool(self.mp_parameters), "SageMaker model parallelism is not supported by "
             "trainwell: leave mp_parameters empty (use fsdp or deepspeed to shard a model)"),
            ("train_sampling_strategy", self.train_sampling_strategy == "batch_rebalance", "trainwell has no "
             "cost-balanced batch sampler (batches of varying size): use 'group_by_length' to cut padding"),
        )
        for name, refused, why in checks:
            if refused:
                raise NotImplementedError(f"{name}={getattr(self, name)!r} is not supported: {why}.")
        if self.optim_target_modules is not None and not str(getattr(self.optim, "value", self.optim)).startswith(
                ("galore", "apollo")):
            raise ValueError(f"optim_target_modules is only used by the GaLore and APOLLO optimizers; optim="
                             f"{getattr(self.optim, 'value', self.optim)!r} ignores it: set optim='galore_adamw' "
                             "(or another galore_*/apollo_* name) or leave optim_target_modules unset.")
        self._check_accelerator_config()
        check_parallelism_config(self.parallelism_config)

    def _check_accelerator_config(self) -> None:
        """The accelerate data-loading options: values that match trainwell's loaders, else an error."""
        config = dict(_parsed_dict("accelerator_config", self.accelerator_config))
        fixed = {"split_batches": False, "dispatch_batches": None, "even_batches": True,
                 "use_seedable_sampler": True, "non_blocking": False,
                 "gradient_accumulation_kwargs": None, "use_configured_state": False}
        for key, value in config.items():
            if key in ("gradient_accumulation_kwargs", "non_blocking", "use_configured_state"):
                # trainwell accumulates over gradient_accumulation_steps itself, and always copies batches with
                # non_blocking=True (on the compute stream, so it is safe either way); use_configured_state=True
                # (sentence-transformers sets it) asks to reuse the process state configured before the
                # arguments: trainwell always reads the one state of the launch (runtime/distributed.py) lazily
                # and never resets it, so both values behave the same
                continue
            if key not in fixed:
                raise ValueError(f"accelerator_config has an unknown key {key!r}; known keys are {sorted(fixed)}.")
            if key == "dispatch_batches" and value is False:
                continue  # False and None both mean: every rank reads its own shard, as trainwell does
            if value != fixed[key]:
                raise NotImplementedError(
                    f"accelerator_config {key}={value!r} is not supported by trainwell's data loaders, which "
                    f"always behave as {key}={fixed[key]!r} (each rank reads its own shard of per-device batches "
                    f"from a seeded, resumable sampler); drop {key} from accelerator_config.")
