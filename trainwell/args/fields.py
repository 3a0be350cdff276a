"""``TrainingArguments``: every knob of the training loop, with upstream names, defaults and validation.

Pure data: ``__post_init__`` converts strings to enums, maps deprecated spellings (with a ``FutureWarning``),
fills derived defaults and raises ``ValueError`` naming the field and the fix. It never touches devices or
process groups; ``device``, ``n_gpu``, ``world_size``... are resolved lazily from :mod:`trainwell.runtime.distributed`
the first time they are read, and cached outside the dataclass fields (not in ``to_dict``/``repr``/pickles).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import math
import os
import socket
import warnings
from dataclasses import MISSING, dataclass, field, fields
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..utils.logging_utils import passive_level
from ..utils.preflight import coerce_field_types
from ..utils.trainer_utils import (
    ExplicitEnum,
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
    ShardedDDPOption,
)
from ..utils.trackers import REPORT_TO_INTEGRATIONS, get_available_reporting_integrations

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

trainer_log_levels: dict[str, int] = {
    "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
    "error": logging.ERROR, "critical": logging.CRITICAL, "passive": -1,
}

INCLUDE_FOR_METRICS = ("inputs", "loss")
TORCH_COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
DDP_BACKENDS = ("nccl", "gloo", "mpi", "ccl", "hccl", "cncl", "mccl")
_DICT_FIELDS = ("lr_scheduler_kwargs", "fsdp_config", "accelerator_config", "deepspeed",
                "gradient_checkpointing_kwargs", "liger_kernel_config")
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


def _f(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None, **meta: Any) -> Any:
    """A dataclass field whose ``metadata`` carries the ``--help`` text (and ``choices``/``aliases``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"`{old}` is deprecated and will be removed in a future version; use `{new}` instead.",
                  FutureWarning, stacklevel=4)


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


def _plain(value: Any) -> Any:
    """A json-friendly copy: enums as their values, containers recursively, config objects via ``to_dict``."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "to_dict") and callable(value.to_dict):
        return value.to_dict()
    return value


def _runs_on_cpu(use_cpu: bool) -> bool:
    """Whether this process would train on the CPU (no CUDA or MPS device, or ``use_cpu``)."""
    if use_cpu:
        return True
    import torch

    mps = getattr(torch.backends, "mps", None)
    return not torch.cuda.is_available() and not (mps is not None and mps.is_available())


def suggest_unknown_arguments(cls: type) -> type:
    """Class decorator: an unknown keyword argument is a TypeError that suggests the closest field name."""
    import difflib
    import functools

    init = cls.__init__
    names = frozenset(f.name for f in fields(cls) if f.init)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        unknown = [key for key in kwargs if key not in names]
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, names, n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise TypeError(f"{cls.__name__}.__init__() got an unexpected keyword argument: {', '.join(hints)}")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


@suggest_unknown_arguments
@dataclass(repr=False)  # __repr__ is __str__ (below): dataclass would compile one over 137 fields for nothing
class TrainingArguments:
    """The arguments of the training loop (upstream ``transformers.TrainingArguments`` names and defaults).

    Read from the command line with :class:`trainwell.args.parser.ArgParser`. Derived values (``device``,
    ``n_gpu``, ``world_size``, ``train_batch_size``...) are properties computed on first use.
    """

    # --- what to run and where to write
    output_dir: str | None = _f("trainer_output", "Where checkpoints, predictions and logs are written.")
    overwrite_output_dir: bool = _f(False, "Overwrite the content of output_dir.")
    do_train: bool = _f(False, "Run training (read by scripts, not by Trainer).")
    do_eval: bool = _f(False, "Run evaluation; set to True when eval_strategy is not 'no'.")
    do_predict: bool = _f(False, "Run predictions on the test set (read by scripts).")
    eval_strategy: IntervalStrategy | str = _f("no", "When to evaluate during training: no, steps or epoch.",
                                              choices=[m.value for m in IntervalStrategy])
    evaluation_strategy: IntervalStrategy | str | None = _f(None, "Deprecated: use eval_strategy.")
    prediction_loss_only: bool = _f(False, "When evaluating and predicting, only return the loss.")
    # --- batches and optimisation
    per_device_train_batch_size: int = _f(8, "Batch size per device (GPU/CPU core) for training.")
    per_device_eval_batch_size: int = _f(8, "Batch size per device (GPU/CPU core) for evaluation.")
    per_gpu_train_batch_size: int | None = _f(None, "Deprecated: use per_device_train_batch_size.")
    per_gpu_eval_batch_size: int | None = _f(None, "Deprecated: use per_device_eval_batch_size.")
    gradient_accumulation_steps: int = _f(1, "Micro-batches to accumulate before each optimizer step.")
    eval_accumulation_steps: int | None = _f(None, "Prediction steps to accumulate on device before moving "
                                             "outputs to the CPU (unset: keep all on device).")
    eval_delay: float | None = _f(0, "Epochs or steps to wait before the first evaluation (per eval_strategy).")
    torch_empty_cache_steps: int | None = _f(None, "Call torch.<device>.empty_cache() every this many steps.")
    learning_rate: float = _f(5e-5, "The initial learning rate of the optimizer.")
    weight_decay: float = _f(0.0, "Weight decay for all parameters except biases and norm weights.")
    adam_beta1: float = _f(0.9, "Beta1 of the Adam optimizers.")
    adam_beta2: float = _f(0.999, "Beta2 of the Adam optimizers.")
    adam_epsilon: float = _f(1e-8, "Epsilon of the Adam optimizers.")
    max_grad_norm: float = _f(1.0, "Maximum gradient norm for clipping (0 disables clipping).")
    num_train_epochs: float = _f(3.0, "Total number of training epochs (a fraction runs part of the last).")
    max_steps: int = _f(-1, "If > 0, the total number of optimizer steps; overrides num_train_epochs.")
    lr_scheduler_type: SchedulerType | str = _f("linear", "The learning-rate schedule.",
                                                choices=[m.value for m in SchedulerType])
    lr_scheduler_kwargs: dict | str | None = _f(help="Extra scheduler arguments (dict or JSON string).",
                                                factory=dict)
    warmup_ratio: float = _f(0.0, "Fraction of the total steps used for a linear warmup.")
    warmup_steps: float = _f(0, "Steps of linear warmup (or a ratio in (0, 1) of the run); overrides "
                                "warmup_ratio.")
    # --- logging
    log_level: str = _f("passive", "Log level of the main process ('passive' keeps the library's level).",
                        choices=list(trainer_log_levels))
    log_level_replica: str = _f("warning", "Log level of the replicas.", choices=list(trainer_log_levels))
    log_on_each_node: bool = _f(True, "In multi-node runs, log on the main process of every node.")
    logging_dir: str | None = _f(None, "Log directory, default output_dir/runs/<date>_<host>.")
    logging_strategy: IntervalStrategy | str = _f("steps", "When to log: no, steps or epoch.",
                                                  choices=[m.value for m in IntervalStrategy])
    logging_first_step: bool = _f(False, "Log the first global step.")
    logging_steps: float = _f(500, "Log every this many steps (a float in (0, 1) is a ratio of the run).")
    logging_nan_inf_filter: bool = _f(True, "Skip nan/inf losses when averaging the logged loss.")
    # --- checkpoints
    save_strategy: SaveStrategy | str = _f("steps", "When to save: no, steps, epoch or best.",
                                           choices=[m.value for m in SaveStrategy])
    save_steps: float = _f(500, "Save every this many steps (a float in (0, 1) is a ratio of the run).")
    save_total_limit: int | None = _f(None, "Keep at most this many checkpoints (the best one is kept too).")
    save_safetensors: bool | None = _f(True, "Save weights as safetensors instead of torch.save.")
    save_on_each_node: bool = _f(False, "In multi-node runs, save on every node's main process.")
    save_only_model: bool = _f(False, "Save only the model (no optimizer/scheduler/RNG: cannot resume).")
    restore_callback_states_from_checkpoint: bool = _f(False, "Restore callback states when resuming.")
    trust_checkpoint_pickles: bool = _f(False, "trainwell only: let a resume unpickle DeepSpeed/DCP checkpoint files "
                                        "holding types outside the safe allow-list (runs their code: only for "
                                        "checkpoints from a source you trust).")
    async_save: bool = _f(False, "trainwell only: write checkpoints in a background thread; training blocks only "
                                 "while the state is copied to host memory (one process, DDP or FSDP; not DeepSpeed "
                                 "nor sharded_ddp; callbacks' on_save runs before the files exist).")
    enable_jit_checkpoint: bool = _f(False, "On SIGTERM/SIGINT, save a checkpoint even with save_strategy='no' "
                                            "(trainwell always stops gracefully and saves otherwise).")
    # --- devices and precision
    no_cuda: bool = _f(False, "Deprecated: use use_cpu.")
    use_cpu: bool = _f(False, "Train on the CPU even when a GPU is available.")
    use_mps_device: bool = _f(False, "Deprecated: MPS is used automatically when available.")
    seed: int = _f(42, "Random seed set at the start of training.")
    data_seed: int | None = _f(None, "Seed of the data samplers (default: seed).")
    jit_mode_eval: bool = _f(False, "Use torch.jit tracing for inference.")
    use_ipex: bool = _f(False, "Use Intel extension for PyTorch (accepted, no effect).")
    bf16: bool = _f(False, "bfloat16 mixed precision (Ampere GPUs or CPU).")
    fp16: bool = _f(False, "float16 mixed precision (needs a GPU).")
    fp16_opt_level: str = _f("O1", "Apex AMP optimisation level.", choices=["O0", "O1", "O2", "O3"])
    half_precision_backend: str = _f("auto", "Mixed-precision backend.", choices=["auto", "apex", "cpu_amp"])
    bf16_full_eval: bool = _f(False, "Evaluate in pure bfloat16 (faster, may change metrics).")
    fp16_full_eval: bool = _f(False, "Evaluate in pure float16 (faster, may change metrics).")
    tf32: bool | None = _f(None, "Enable TF32 matmuls (Ampere or newer GPUs).")
    # --- distribution
    local_rank: int = _f(-1, "Rank of the process on its node (set by legacy launchers).")
    ddp_backend: str | None = _f(None, "Process-group backend.", choices=list(DDP_BACKENDS))
    tpu_num_cores: int | None = _f(None, "Number of TPU cores (accepted, no effect).")
    tpu_metrics_debug: bool = _f(False, "Deprecated: use debug='tpu_metrics_debug'.")
    debug: str | list[DebugOption] = _f("", "Debug features: underflow_overflow, tpu_metrics_debug.")
    # --- data loading
    dataloader_drop_last: bool = _f(False, "Drop the last incomplete batch.")
    eval_steps: float | None = _f(None, "Evaluate every this many steps (default logging_steps; a float "
                                  "in (0, 1) is a ratio of the run).")
    dataloader_num_workers: int = _f(0, "Data loading subprocesses (0: load in the main process).")
    dataloader_prefetch_factor: int | None = _f(None, "Batches loaded in advance by each worker.")
    past_index: int = _f(-1, "Index of the model output holding past states (fed back as `mems`).")
    run_name: str | None = _f(None, "A descriptor of the run for loggers (default: output_dir).")
    disable_tqdm: bool | None = _f(None, "Disable progress bars (default: True when logging above warning).")
    remove_unused_columns: bool | None = _f(True, "Drop dataset columns the model's forward does not take.")
    label_names: list[str] | None = _f(None, "Input keys holding the labels (default ['labels']).")
    load_best_model_at_end: bool | None = _f(False, "Load the best checkpoint at the end of training.")
    metric_for_best_model: str | None = _f(None, "Metric comparing checkpoints (default 'loss').")
    greater_is_better: bool | None = _f(None, "Whether a larger metric is better (default: not *loss).")
    ignore_data_skip: bool = _f(False, "When resuming, do not skip the batches already seen.")
    # --- sharding and integrations
    fsdp: list[FSDPOption] | str | None = _f("", "FSDP options, e.g. 'full_shard auto_wrap'.")
    fsdp_min_num_params: int = _f(0, "FSDP: minimum parameters for auto-wrapping a module.")
    fsdp_config: dict | str | None = _f(None, "FSDP config (dict, JSON string or JSON file).")
    fsdp_transformer_layer_cls_to_wrap: str | None = _f(None, "Deprecated: use fsdp_config.")
    sharded_ddp: list[ShardedDDPOption] | str | None = _f("", "Deprecated: 'simple' (ZeRO optimizer) or "
                                                         "zero_dp_2/zero_dp_3 (mapped to fsdp).")
    accelerator_config: dict | str | None = _f(None, "Data-loading config (dict, JSON string or JSON file).")
    deepspeed: dict | str | None = _f(None, "DeepSpeed config (path to a JSON file, JSON string or dict).")
    label_smoothing_factor: float = _f(0.0, "Label smoothing epsilon (0 disables).")
    optim: OptimizerNames | str = _f("adamw_torch", "The optimizer.", choices=[m.value for m in OptimizerNames])
    optim_args: str | None = _f(None, "Extra optimizer arguments, 'key=value,key=value'.")
    adafactor: bool = _f(False, "Deprecated: use optim='adafactor'.")
    group_by_length: bool = _f(False, "Group samples of similar length into batches.")
    length_column_name: str | None = _f("length", "Column with precomputed lengths for group_by_length.")
    report_to: None | str | list[str] = _f("none", "Integrations to report to: 'all', 'none' or names.")
    ddp_find_unused_parameters: bool | None = _f(None, "DDP find_unused_parameters.")
    ddp_bucket_cap_mb: int | None = _f(None, "DDP bucket_cap_mb.")
    ddp_broadcast_buffers: bool | None = _f(None, "DDP broadcast_buffers.")
    dataloader_pin_memory: bool = _f(True, "Pin memory in data loaders.")
    dataloader_persistent_workers: bool = _f(False, "Keep data loader workers alive between epochs.")
    skip_memory_metrics: bool = _f(True, "Skip the memory profiler metrics.")
    use_legacy_prediction_loop: bool = _f(False, "Use the legacy prediction loop.")
    push_to_hub: bool = _f(False, "Push the model to the Hugging Face Hub (see hub_strategy).")
    resume_from_checkpoint: str | None = _f(None, "Checkpoint folder to resume from (read by scripts); "
                                                   "'auto': the newest checkpoint if any, else start fresh.")
    hub_model_id: str | None = _f(None, "Hub repository to push to (default: the name of output_dir).")
    hub_strategy: HubStrategy | str = _f("every_save", "What to push and when: end, every_save, checkpoint, all_checkpoints.",
                                         choices=[m.value for m in HubStrategy])
    hub_token: str | None = _f(None, "Hub token (masked in logs).")
    hub_private_repo: bool | None = _f(None, "Create the hub repository private.")
    hub_always_push: bool = _f(False, "Push at every save even when the previous push has not finished.")
    hub_revision: str | None = _f(None, "Hub branch (revision) to push to.")
    gradient_checkpointing: bool = _f(False, "Trade compute for memory with gradient checkpointing.")
    gradient_checkpointing_kwargs: dict | str | None = _f(None, "Arguments of gradient_checkpointing_enable.")
    include_inputs_for_metrics: bool = _f(False, "Deprecated: use include_for_metrics=['inputs'].")
    include_for_metrics: list[str] = _f(help="Extra values passed to compute_metrics: inputs, loss.",
                                        factory=list)
    eval_do_concat_batches: bool = _f(True, "Concatenate predictions across batches.")
    fp16_backend: str = _f("auto", "Deprecated: use half_precision_backend.",
                           choices=["auto", "amp", "cuda_amp", "apex", "cpu_amp"])
    push_to_hub_model_id: str | None = _f(None, "Deprecated: use hub_model_id.")
    push_to_hub_organization: str | None = _f(None, "Deprecated: use hub_model_id.")
    push_to_hub_token: str | None = _f(None, "Deprecated: use hub_token.")
    mp_parameters: str = _f("", "Model-parallel parameters (accepted, unused).")
    auto_find_batch_size: bool = _f(False, "Halve the batch size after out-of-memory errors.")
    full_determinism: bool = _f(False, "Deterministic algorithms everywhere (slower).")
    torchdynamo: str | None = _f(None, "Deprecated: use torch_compile_backend.")
    ray_scope: str | None = _f("last", "Ray tune scope.", choices=["last", "all"])
    ddp_timeout: int = _f(1800, "Process-group timeout in seconds.")
    torch_compile: bool = _f(False, "Compile the model with torch.compile.")
    torch_compile_backend: str | None = _f(None, "torch.compile backend (implies torch_compile).")
    torch_compile_mode: str | None = _f(None, "torch.compile mode (implies torch_compile).",
                                        choices=list(TORCH_COMPILE_MODES))
    dispatch_batches: bool | None = _f(None, "Deprecated: use accelerator_config.")
    split_batches: bool | None = _f(None, "Deprecated: use accelerator_config.")
    include_tokens_per_second: bool | None = _f(False, "Report train tokens/second/device.")
    include_num_input_tokens_seen: bool | None = _f(False, "Track the number of input tokens seen.")
    neftune_noise_alpha: float | None = _f(None, "NEFTune embedding noise alpha.")
    optim_target_modules: None | str | list[str] = _f(None, "Modules targeted by GaLore-like optimizers.")
    batch_eval_metrics: bool = _f(False, "Call compute_metrics per batch (compute_result at the end).")
    eval_on_start: bool = _f(False, "Run one evaluation before training (sanity check).")
    use_liger_kernel: bool | None = _f(False, "Use Liger kernels (left to the trainer).")
    liger_kernel_config: dict | str | None = _f(None, "Liger kernel options.")
    eval_use_gather_object: bool | None = _f(False, "Gather non-tensor outputs across ranks.")
    average_tokens_across_devices: bool | None = _f(False, "Average token counts across devices.")

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        coerce_field_types(self)  # "1e-3" -> 1e-3 as the parser would; a TypeError naming the field otherwise
        self._apply_deprecations()
        self._normalise_paths()
        self._convert_enums()
        self._parse_dict_fields()
        self._check_numbers()
        self._resolve_step_intervals()
        self._resolve_best_model()
        self._check_precision()
        self._resolve_sharded_ddp()
        self._resolve_fsdp()
        self._check_deepspeed()
        self.report_to = _normalise_report_to(self.report_to)
        self._resolve_misc()

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
        for name in _DICT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, str):
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
            (not 0 <= self.warmup_ratio <= 1, "warmup_ratio must lie in [0, 1]"),
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
             "torch_empty_cache_steps must be a positive integer, or None to never empty the cache"),
        ]
        for failed, message in checks:
            if failed:  # each message starts with the name of the field it checks
                name = message.split(" ", 1)[0]
                raise ValueError(f"{message}; got {name}={getattr(self, name)!r}.")
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            logger.warning("Both warmup_steps and warmup_ratio are set: warmup_steps wins.")

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
        if self.save_strategy == SaveStrategy.STEPS and self.save_steps == 0:
            raise ValueError("save_steps=0 with save_strategy='steps': set save_steps > 0 or save_strategy='no'.")
        if self.eval_strategy != IntervalStrategy.NO:
            self.do_eval = True

    def _resolve_best_model(self) -> None:
        needs_metric = self.load_best_model_at_end or self.lr_scheduler_type == SchedulerType.REDUCE_ON_PLATEAU
        if needs_metric and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"
        if self.greater_is_better is None and self.metric_for_best_model is not None:
            self.greater_is_better = not self.metric_for_best_model.endswith("loss")
        if self.save_strategy == SaveStrategy.BEST:
            if self.metric_for_best_model is None:
                raise ValueError("save_strategy='best' needs metric_for_best_model (e.g. 'eval_loss').")
            if self.eval_strategy == IntervalStrategy.NO:
                logger.warning("save_strategy='best' saves after evaluations, but eval_strategy='no'.")
        if self.load_best_model_at_end and self.save_strategy != SaveStrategy.BEST:
            self._check_best_model_intervals()
        if self.lr_scheduler_type == SchedulerType.REDUCE_ON_PLATEAU and self.eval_strategy == IntervalStrategy.NO:
            raise ValueError("lr_scheduler_type='reduce_lr_on_plateau' steps on evaluation metrics; set "
                             "eval_strategy to 'steps' or 'epoch'.")

    def _check_best_model_intervals(self) -> None:
        if self.eval_strategy.value != self.save_strategy.value:
            raise ValueError("load_best_model_at_end needs save_strategy and eval_strategy to match; got "
                             f"eval_strategy={self.eval_strategy.value!r}, save_strategy={self.save_strategy.value!r}.")
        if self.eval_strategy != IntervalStrategy.STEPS:
            return
        save, every = self.save_steps, self.eval_steps
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
        value = ["offload" if word == "cpu_offload" else word for word in words]  # seed 002: "zero_dp_2 cpu_offload"
        opts = _to_enum_list(ShardedDDPOption, value, "sharded_ddp")
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
        config = {(k[5:] if k.startswith("fsdp_") else k): v for k, v in (self.fsdp_config or {}).items()}
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
                self.accelerator_config = {**(self.accelerator_config or {}), name: getattr(self, name)}
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
        import importlib.util

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

    def _check_accelerator_config(self) -> None:
        """The accelerate data-loading options: values that match trainwell's loaders, else an error."""
        config = dict(self.accelerator_config or {})
        fixed = {"split_batches": False, "dispatch_batches": None, "even_batches": True,
                 "use_seedable_sampler": True, "non_blocking": False,
                 "gradient_accumulation_kwargs": None, "use_configured_state": False}
        for key, value in config.items():
            if key in ("gradient_accumulation_kwargs", "non_blocking"):
                # trainwell accumulates over gradient_accumulation_steps itself, and always copies batches with
                # non_blocking=True (on the compute stream, so it is safe either way)
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

    # ------------------------------------------------------------------ runtime (lazy)
    def _runtime(self) -> tuple[Any, torch.device, int]:
        """(LaunchEnv, device, n_gpu), resolved once from the launcher's environment; no process group."""
        cached = self.__dict__.get("_runtime_cache")
        if cached is None:
            from ..runtime.distributed import read_launch_env, resolve_device

            env = read_launch_env(self.local_rank)
            device = resolve_device(use_cpu=self.use_cpu, local_rank=env.local_rank)
            if device.type != "cuda":
                n_gpu = 0
            elif env.distributed:
                n_gpu = 1
            else:
                import torch

                n_gpu = torch.cuda.device_count()
            cached = self.__dict__["_runtime_cache"] = (env, device, n_gpu)
        return cached

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_runtime_cache", None)  # re-resolve on the machine that unpickles
        state.pop("hf_deepspeed_config", None)  # process-wide registration, not data
        return state

    @property
    def device(self) -> torch.device:
        """The device this process uses."""
        return self._runtime()[1]

    @property
    def n_gpu(self) -> int:
        """CUDA devices used by this process: 0 on CPU/MPS, 1 under a launcher, all visible ones otherwise."""
        return self._runtime()[2]

    @property
    def parallel_mode(self) -> ParallelMode:
        """DISTRIBUTED under a launcher, NOT_DISTRIBUTED for several GPUs in one process, else NOT_PARALLEL."""
        if self._runtime()[0].distributed:
            return ParallelMode.DISTRIBUTED
        return ParallelMode.NOT_DISTRIBUTED if self.n_gpu > 1 else ParallelMode.NOT_PARALLEL

    @property
    def world_size(self) -> int:
        """Number of processes training together."""
        from ..runtime.distributed import get_world_size, is_dist

        return get_world_size() if is_dist() else self._runtime()[0].world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        from ..runtime.distributed import get_rank, is_dist

        return get_rank() if is_dist() else self._runtime()[0].rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return max(self._runtime()[0].local_rank, 0)

    @property
    def train_batch_size(self) -> int:
        """Samples per forward pass of this process (per-device size times the DataParallel GPUs)."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """Samples per evaluation forward pass of this process."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """``ddp_timeout`` as a ``timedelta`` for ``init_process_group``."""
        return timedelta(seconds=self.ddp_timeout)

    @property
    def place_model_on_device(self) -> bool:
        """Whether the trainer moves the model to ``device`` (False only for model parallelism)."""
        return True

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the main process of each node, or only the global main process."""
        return self.local_process_index == 0 if self.log_on_each_node else self.process_index == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes checkpoints: the global main process, or each node's with save_on_each_node."""
        return self.local_process_index == 0 if self.save_on_each_node else self.process_index == 0

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the body on the main process first, then on the others (e.g. dataset preprocessing and caching).

        ``local`` picks the main process of each node instead of the global one. A no-op in one process.
        """
        from ..runtime.distributed import barrier, is_dist

        if self.world_size <= 1 or not is_dist():
            yield
            return
        is_main = (self.local_process_index if local else self.process_index) == 0
        if not is_main:
            logger.debug("%d: waiting for the main process to perform %s", self.process_index, desc)
            barrier()
        try:
            yield
        finally:
            if is_main:
                barrier()

    def get_process_log_level(self) -> int:
        """The log level of this process: log_level on logging processes, log_level_replica on the others.

        "passive" keeps what the user set, on either library's logger (as upstream, which returns transformers'
        verbosity): the ``trainwell`` logger's own level if set, else transformers' verbosity when a script has
        loaded transformers' logging, else WARNING.
        """
        level = trainer_log_levels[self.log_level if self.should_log else self.log_level_replica]
        return passive_level() if level == -1 else level

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup steps: ``warmup_steps`` if >= 1, ``ceil(warmup_steps * num_training_steps)`` for a ratio in
        (0, 1), else ``ceil(warmup_ratio * num_training_steps)``."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        ratio = self.warmup_steps if self.warmup_steps > 0 else self.warmup_ratio
        return math.ceil(num_training_steps * ratio)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (enums as strings); secrets (``*_token``) masked as ``<NAME>``."""
        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.init}
        for key, value in out.items():
            if key.endswith("_token") and value is not None:
                out[key] = f"<{key.upper()}>"
        return out

    def to_json_string(self) -> str:
        """``to_dict()`` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2, default=str)

    def to_sanitized_dict(self) -> dict[str, Any]:
        """``to_dict()`` plus the effective batch sizes, with every value an int/float/str/bool/Tensor (for hparams)."""
        import torch

        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        kinds = (bool, int, float, str, torch.Tensor)
        return {k: v if type(v) in kinds else str(v) for k, v in d.items()}

    def __str__(self) -> str:
        body = "".join(f"{k}={v},\n" for k, v in sorted(self.to_dict().items()))
        return f"{type(self).__name__}(\n{body})"

    __repr__ = __str__

    # ------------------------------------------------------------------ upstream helper setters
    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1,
                     seed: int = 42, gradient_checkpointing: bool = False) -> TrainingArguments:
        """Turn training on and set its main hyper-parameters; returns self."""
        self.do_train = True
        self.learning_rate, self.per_device_train_batch_size = learning_rate, batch_size
        self.weight_decay, self.num_train_epochs, self.max_steps = weight_decay, num_epochs, max_steps
        self.gradient_accumulation_steps, self.seed = gradient_accumulation_steps, seed
        self.gradient_checkpointing = gradient_checkpointing
        return self

    def set_evaluate(self, strategy: str | IntervalStrategy = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: int | None = None, delay: float | None = None,
                     loss_only: bool = False, jit_mode: bool = False) -> TrainingArguments:
        """Set the evaluation strategy and batch size; returns self."""
        self.eval_strategy = _to_enum(IntervalStrategy, strategy, "eval_strategy")
        if self.eval_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("set_evaluate(strategy='steps') needs steps > 0.")
        self.do_eval = self.eval_strategy != IntervalStrategy.NO
        self.eval_steps, self.per_device_eval_batch_size = steps, batch_size
        self.eval_accumulation_steps, self.eval_delay = accumulation_steps, delay
        self.prediction_loss_only, self.jit_mode_eval = loss_only, jit_mode
        return self

    def set_testing(self, batch_size: int = 8, loss_only: bool = False, jit_mode: bool = False) -> TrainingArguments:
        """Turn prediction on; returns self."""
        self.do_predict, self.per_device_eval_batch_size = True, batch_size
        self.prediction_loss_only, self.jit_mode_eval = loss_only, jit_mode
        return self

    def set_save(self, strategy: str | SaveStrategy = "steps", steps: int = 500, total_limit: int | None = None,
                 on_each_node: bool = False) -> TrainingArguments:
        """Set the checkpoint strategy; returns self."""
        self.save_strategy = _to_enum(SaveStrategy, strategy, "save_strategy")
        if self.save_strategy == SaveStrategy.STEPS and steps == 0:
            raise ValueError("set_save(strategy='steps') needs steps > 0.")
        self.save_steps, self.save_total_limit, self.save_on_each_node = steps, total_limit, on_each_node
        return self

    def set_logging(self, strategy: str | IntervalStrategy = "steps", steps: int = 500,
                    report_to: str | list[str] = "none", level: str = "passive", first_step: bool = False, nan_inf_filter: bool = False,
                    on_each_node: bool = False, replica_level: str = "passive") -> TrainingArguments:
        """Set logging strategy, integrations and levels; returns self."""
        self.logging_strategy = _to_enum(IntervalStrategy, strategy, "logging_strategy")
        if self.logging_strategy == IntervalStrategy.STEPS and steps == 0:
            raise ValueError("set_logging(strategy='steps') needs steps > 0.")
        for name, lvl in (("level", level), ("replica_level", replica_level)):
            if lvl not in trainer_log_levels:
                raise ValueError(f"set_logging({name}={lvl!r}): choose one of {list(trainer_log_levels)}.")
        self.logging_steps, self.report_to = steps, _normalise_report_to(report_to)
        self.log_level, self.log_level_replica = level, replica_level
        self.logging_first_step, self.logging_nan_inf_filter = first_step, nan_inf_filter
        self.log_on_each_node = on_each_node
        return self

    def set_push_to_hub(self, model_id: str, strategy: str | HubStrategy = "every_save", token: str | None = None,
                        private_repo: bool | None = None, always_push: bool = False,
                        revision: str | None = None) -> TrainingArguments:
        """Enable pushing to the hub repository ``model_id``; returns self."""
        self.push_to_hub, self.hub_model_id = True, model_id
        self.hub_strategy = _to_enum(HubStrategy, strategy, "hub_strategy")
        self.hub_token, self.hub_private_repo = token, private_repo
        self.hub_always_push, self.hub_revision = always_push, revision
        return self

    def set_optimizer(self, name: str | OptimizerNames = "adamw_torch", learning_rate: float = 5e-5,
                      weight_decay: float = 0, beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8,
                      args: str | None = None) -> TrainingArguments:
        """Set the optimizer and its hyper-parameters; returns self."""
        self.optim = _to_enum(OptimizerNames, name, "optim")
        self.learning_rate, self.weight_decay = learning_rate, weight_decay
        self.adam_beta1, self.adam_beta2, self.adam_epsilon, self.optim_args = beta1, beta2, epsilon, args
        return self

    def set_lr_scheduler(self, name: str | SchedulerType = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_ratio: float = 0, warmup_steps: float = 0) -> TrainingArguments:
        """Set the learning-rate schedule and run length; returns self."""
        self.lr_scheduler_type = _to_enum(SchedulerType, name, "lr_scheduler_type")
        if not 0 <= warmup_ratio <= 1:
            raise ValueError(f"set_lr_scheduler(warmup_ratio={warmup_ratio}) must lie in [0, 1].")
        self.num_train_epochs, self.max_steps = num_epochs, max_steps
        self.warmup_ratio, self.warmup_steps = warmup_ratio, _normalise_steps("warmup_steps", warmup_steps)
        return self

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: int | None = None, auto_find_batch_size: bool = False,
                       ignore_data_skip: bool = False, sampler_seed: int | None = None) -> TrainingArguments:
        """Set the data-loading options; returns self."""
        self.per_device_train_batch_size, self.per_device_eval_batch_size = train_batch_size, eval_batch_size
        self.dataloader_drop_last, self.dataloader_num_workers = drop_last, num_workers
        self.dataloader_pin_memory, self.dataloader_persistent_workers = pin_memory, persistent_workers
        self.dataloader_prefetch_factor, self.auto_find_batch_size = prefetch_factor, auto_find_batch_size
        self.ignore_data_skip, self.data_seed = ignore_data_skip, sampler_seed
        return self
