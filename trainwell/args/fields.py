"""``TrainingArguments``: every knob of the training loop, with upstream names, defaults and help: the reference.

Pure data. ``__post_init__`` (:mod:`.validate`) converts strings to enums, maps deprecated spellings and raises
``ValueError`` naming the field and the fix; ``device``, ``n_gpu``, ``world_size``... (:mod:`.runtime`) are
resolved lazily from :mod:`trainwell.runtime.distributed` the first time they are read, and cached outside the
dataclass fields (not in ``to_dict``/``repr``/pickles).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from dataclasses import MISSING, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Literal

from ..utils.option_enums import (
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    SaveStrategy,
    SchedulerType,
    ShardedDDPOption,
)
from .runtime import RuntimeProperties
from .validate import (  # noqa: F401  (DebugOption, _RENAMED, REPORT_TO_INTEGRATIONS: imported from here too)
    DDP_BACKENDS,
    INCLUDE_FOR_METRICS,
    _DICT_FIELDS,
    REPORT_TO_INTEGRATIONS,
    TORCH_COMPILE_MODES,
    _RENAMED,
    ArgumentValidation,
    _deprecated_checkpointing,
    DebugOption,
    _normalise_report_to,
    _normalise_steps,
    _to_enum,
    trainer_log_levels,
)


def _default_optim() -> str:
    """Upstream 5.x's default ``optim``: ``adamw_torch_fused`` with torch >= 2.8 (fused AdamW kernels on every
    device, the CPU included), else ``adamw_torch``. torch's version is read from ``torch/version.py`` when torch is
    not imported yet, so that importing the arguments does not import torch."""
    try:
        torch = sys.modules.get("torch")
        version = getattr(torch, "__version__", None)
        if version is None:
            spec = importlib.util.find_spec("torch")
            if spec is None or spec.origin is None:
                return "adamw_torch_fused"  # an unusual install: today's torch
            text = Path(spec.origin).with_name("version.py").read_text()
            found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
            if found is None:
                return "adamw_torch_fused"
            version = found.group(1)
        numbers = re.match(r"(\d+)\.(\d+)", str(version))
        if numbers is None:
            return "adamw_torch_fused"
        major, minor = (int(part) for part in numbers.groups())
    except Exception:  # an unusual install: today's torch
        return "adamw_torch_fused"
    return "adamw_torch_fused" if (major, minor) >= (2, 8) else "adamw_torch"


def _f(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None, **meta: Any) -> Any:
    """A dataclass field whose ``metadata`` carries the ``--help`` text (and ``choices``/``aliases``)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help, **meta})
    return field(default=default, metadata={"help": help, **meta})


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


def suggest_unknown_arguments(cls: type) -> type:
    """Class decorator: an unknown keyword argument is a TypeError that suggests the closest field name."""
    import difflib
    import functools

    init = getattr(cls, "__init__")  # not cls.__init__: mypy calls reading __init__ off a type unsound
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

    setattr(cls, "__init__", __init__)
    return cls


@suggest_unknown_arguments
@dataclass(repr=False)  # __repr__ is __str__ (below): dataclass would compile one over 137 fields for nothing
class TrainingArguments(ArgumentValidation, RuntimeProperties):
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
    warmup_ratio: float | None = _f(0.0, "Fraction of the total steps used for a linear warmup.")
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
    checkpoint_store: str | None = _f(None, "trainwell only: an fsspec URL (s3://bucket/run, gs://..., memory://...) "
                                            "where every checkpoint is also published, uploaded in the background "
                                            "after the local commit in output_dir; a resume with an empty "
                                            "output_dir downloads the newest complete one from there.")
    storage_options: dict | str | None = _f(None, "trainwell only: fsspec storage options of checkpoint_store (a "
                                                  "dict or JSON; credentials: never written to a checkpoint, a log "
                                                  "or a tracker). Default: the environment / fsspec config.")
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
    dataloader_multiprocessing_context: str | None = _f(
        None, "Start method of the data loading workers ('fork', 'spawn' or 'forkserver'; needs "
        "dataloader_num_workers > 0). Default: PyTorch's ('fork' on MPS with more than one worker).",
        choices=["fork", "spawn", "forkserver"])
    dataloader_in_order: bool = _f(True, "Yield batches in the order workers were dispatched; False: as soon as "
                                         "they are ready (less tail latency with several workers).")
    train_sampling_strategy: str = _f("random", "Sampler for training: 'random', 'sequential' or 'group_by_length' "
                                      "(which also length-groups evaluation and prediction, as upstream; "
                                      "'batch_rebalance' is upstream's, not supported).",
                                      choices=["random", "sequential", "group_by_length", "batch_rebalance"])
    past_index: int = _f(-1, "Index of the model output holding past states (fed back as `mems`).")
    run_name: str | None = _f(None, "A descriptor of the run for loggers (default: output_dir).")
    project: str = _f("huggingface", "The name of the project to use for logging. Currently, only used by Trackio.")
    trackio_space_id: str | None = _f(None, "Hugging Face Space id for live Trackio logging ('username/reponame', "
                                      "'orgname/reponame' or 'reponame'); None: log only locally, no Space.")
    trackio_bucket_id: str | None = _f(None, "Hugging Face Bucket id for Trackio when using a Space; unset: Trackio "
                                       "picks a default.")
    # upstream's annotation, member order included: its HfArgumentParser reads ``str | None | Literal[False]`` as a
    # str option (``str | bool | None`` is no type it can call)
    trackio_static_space_id: str | None | Literal[False] = _f(
        None, "Static read-only Trackio Space made after training (a Space id); False: none; None: a default one "
        "when the model is pushed to the Hub.")
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
    parallelism_config: Any = _f(None, "accelerate's ParallelismConfig (read by TRL's configs): data parallelism only "
                                       "(tp/cp/sp/dp_shard sizes of 1; use fsdp or deepspeed to shard).")
    deepspeed: dict | str | None = _f(None, "DeepSpeed config (path to a JSON file, JSON string or dict).")
    label_smoothing_factor: float = _f(0.0, "Label smoothing epsilon (0 disables).")
    optim: OptimizerNames | str = _f(_default_optim(), "The optimizer (default, as upstream 5.x: adamw_torch_fused "
                                     "with torch >= 2.8, else adamw_torch).",
                                     choices=[m.value for m in OptimizerNames])
    optim_args: str | None = _f(None, "Extra optimizer arguments, 'key=value,key=value'.")
    adafactor: bool = _f(False, "Deprecated: use optim='adafactor'.")
    group_by_length: bool = _f(False, "Group samples of similar length into batches (the seeds' name of "
                                      "train_sampling_strategy='group_by_length').")
    length_column_name: str | None = _f("length", "Column with precomputed lengths for "
                                                  "train_sampling_strategy='group_by_length'.")
    report_to: None | str | list[str] = _f("none", "Integrations to report to: 'all', 'none' or names.")
    ddp_find_unused_parameters: bool | None = _f(None, "DDP find_unused_parameters.")
    ddp_bucket_cap_mb: int | None = _f(None, "DDP bucket_cap_mb.")
    ddp_broadcast_buffers: bool | None = _f(None, "DDP broadcast_buffers.")
    ddp_static_graph: bool | None = _f(None, "When using distributed training, the value of the flag `static_graph` "
                                             "passed to `DistributedDataParallel`.")
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
    # upstream 5.24's names; None until __post_init__ resolves them with their deprecated gradient_* aliases (then
    # False / the same dict in both names, as upstream)
    activation_checkpointing: bool | None = _f(None, "Enable activation checkpointing to trade compute for memory. "
                                                     "Reduces memory at the cost of ~20% slower training.")
    activation_checkpointing_kwargs: dict | str | None = _f(
        None, "Keyword arguments passed to `activation_checkpointing_enable()`. `every_n_layers` checkpoints only every "
        "n-th decoder layer instead of all of them; `1` is the usual all-or-nothing behavior, and larger values give "
        "some memory back to speed. `offload` holds the saved activations in pinned host memory, which frees device "
        "memory and makes the step slower. Any other key is forwarded to `torch.utils.checkpoint.checkpoint`.")
    gradient_checkpointing: bool | None = _f(None, "Deprecated alias of `activation_checkpointing`, will be removed "
                                                   "in v6.")
    gradient_checkpointing_kwargs: dict | str | None = _f(None, "Deprecated alias of "
                                                                "`activation_checkpointing_kwargs`, will be removed in v6.")
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
    include_num_input_tokens_seen: str | bool = _f("no", "Track the number of input tokens seen: 'all', "
                                                   "'non_padding' or 'no' (True means 'all', False 'no').")
    neftune_noise_alpha: float | None = _f(None, "NEFTune embedding noise alpha.")
    use_cache: bool = _f(False, "The model's config.use_cache, set when the Trainer is built (training rarely needs "
                                "the cache; some PEFT methods do).")
    optim_target_modules: None | str | list[str] = _f(None, "Modules targeted by GaLore-like optimizers.")
    batch_eval_metrics: bool = _f(False, "Call compute_metrics per batch (compute_result at the end).")
    eval_on_start: bool = _f(False, "Run one evaluation before training (sanity check).")
    use_liger_kernel: bool | None = _f(False, "Use Liger kernels (left to the trainer).")
    liger_kernel_config: dict | str | None = _f(None, "Liger kernel options.")
    eval_use_gather_object: bool | None = _f(False, "Gather non-tensor outputs across ranks.")
    average_tokens_across_devices: bool | None = _f(True, "Average token counts across devices.")


    #: Fields that accept a JSON object string (parsed into a dict by ``__post_init__``), as upstream's class
    #: attribute of the same name: configs built on these arguments (TRL's, sentence-transformers') extend it.
    _VALID_DICT_FIELDS = list(_DICT_FIELDS)

    def get_warmup_steps(self, num_training_steps: int) -> int:
        """Warmup steps: ``warmup_steps`` if >= 1, ``ceil(warmup_steps * num_training_steps)`` for a ratio in
        (0, 1), else ``ceil(warmup_ratio * num_training_steps)`` (``warmup_ratio=None``: no warmup)."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        ratio = self.warmup_steps if self.warmup_steps > 0 else (self.warmup_ratio or 0)
        return math.ceil(num_training_steps * ratio)

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (enums as strings, a ``dtype`` in a dict field as its name); credentials
        (:mod:`.secrets`) masked as ``<NAME>``."""
        from ..utils.secrets import is_secret_field

        out = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.init}
        for key, value in out.items():
            if is_secret_field(key) and value is not None:
                out[key] = f"<{key.upper()}>"
        if self.parallelism_config is not None:  # its sizes (upstream's to_json() returns nothing to write)
            config = self.parallelism_config
            items = config.items() if isinstance(config, dict) else vars(config).items()
            out["parallelism_config"] = {k: _plain(v) for k, v in items if k != "device_mesh" and not k.startswith("_")}
        self._dict_dtype_to_str(out)
        return out

    def _dict_dtype_to_str(self, d: dict[str, Any]) -> None:
        """Upstream's helper: a ``dtype`` key (in ``d`` or a dict nested in it) holding a ``torch.dtype`` becomes its
        name (``torch.bfloat16`` -> ``"bfloat16"``), so that configs such as TRL's ``model_init_kwargs`` write to
        JSON and read back with ``getattr(torch, name)``."""
        if d.get("dtype") is not None and not isinstance(d["dtype"], str):
            d["dtype"] = str(d["dtype"]).rsplit(".", 1)[-1]
        for value in d.values():
            if isinstance(value, dict):
                self._dict_dtype_to_str(value)

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
                     seed: int = 42, activation_checkpointing: bool = False,
                     gradient_checkpointing: bool | None = None) -> TrainingArguments:
        """Turn training on and set its main hyper-parameters; returns self (``gradient_checkpointing``: the
        deprecated alias of ``activation_checkpointing``, as upstream 5.24)."""
        self.do_train = True
        self.learning_rate, self.per_device_train_batch_size = learning_rate, batch_size
        self.weight_decay, self.num_train_epochs, self.max_steps = weight_decay, num_epochs, max_steps
        self.gradient_accumulation_steps, self.seed = gradient_accumulation_steps, seed
        if gradient_checkpointing is not None:
            _deprecated_checkpointing("gradient_checkpointing", "activation_checkpointing")
            activation_checkpointing = gradient_checkpointing
        self.activation_checkpointing = self.gradient_checkpointing = activation_checkpointing
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
