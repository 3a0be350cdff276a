"""DeepSpeed configuration: loading, ``"auto"`` resolution from ``TrainingArguments``, mismatch detection.

Pure data work, no process group and no ``deepspeed`` import: the resolved dict is handed to ``deepspeed.initialize``
by :mod:`trainwell.backends.deepspeed.backend`.

The trainer's arguments are the one source of truth for the values both sides need (batch sizes, accumulation,
clipping, learning rate, Adam hyper-parameters, warmup, precision). A config value of ``"auto"`` is filled from them;
an explicit value that contradicts them is collected, and :func:`resolve_deepspeed_config` raises ONE ``ValueError``
listing every contradiction before anything is built (silently disagreeing values "may fail in very difficult to
detect ways", as the DeepSpeed guide warns).

:class:`DeepSpeedConfig` is the counterpart of upstream's ``HfDeepSpeedConfig``: create it before building a model and
keep it alive; while it lives, :func:`is_deepspeed_zero3_enabled` answers from it (through a weak reference, so
dropping the object turns the answer off again).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

logger = logging.getLogger("trainwell.deepspeed")

AUTO = "auto"

#: keys sized from the model's hidden size (DeepSpeed guide, ZeRO-3 section)
HIDDEN_SIZE_KEYS = (
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
)

#: DeepSpeed scheduler type -> the trainwell ``lr_scheduler_type`` that computes the same schedule
DS_TO_TRAINER_SCHEDULER = {"WarmupLR": "constant_with_warmup", "WarmupDecayLR": "linear"}

_global_config: "weakref.ReferenceType[DeepSpeedConfig] | None" = None


def load_deepspeed_config(config: dict[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """A private deep copy of ``config``: a dict, a path to a JSON file, or a JSON string."""
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if isinstance(config, (str, os.PathLike)):
        text = str(config)
        if text.strip().startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError as err:
                raise ValueError(f"deepspeed: the JSON string is not valid JSON ({err}); fix the config text") from err
        if not os.path.isfile(text):
            raise ValueError(f"deepspeed={text!r}: no such file; pass the path of a DeepSpeed JSON config or a dict")
        with open(text, encoding="utf-8") as handle:
            try:
                return json.load(handle)
            except json.JSONDecodeError as err:
                raise ValueError(f"deepspeed config file {text}: not valid JSON ({err}); fix the file") from err
    raise TypeError(f"deepspeed must be a dict, a JSON file path or a JSON string, got {type(config).__name__}")


def _node(config: dict[str, Any], dotted: str, *, create: bool = False) -> tuple[dict[str, Any] | None, str]:
    """The dict holding the last key of ``dotted`` (None when a parent section is missing) and that key."""
    *parents, key = dotted.split(".")
    node: Any = config
    for name in parents:
        if not isinstance(node, dict):
            return None, key
        if name not in node and create:
            node[name] = {}
        node = node.get(name)
        if node is None:
            return None, key
    return (node if isinstance(node, dict) else None), key


def get_value(config: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``; ``default`` when any part is missing."""
    node, key = _node(config, dotted)
    return default if node is None else node.get(key, default)


def _as_bool(value: Any) -> bool | None:
    """DeepSpeed configs write booleans as true/false or "true"/"false"; anything else (e.g. "auto") is None."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


class DeepSpeedConfig:
    """A DeepSpeed config kept alive for the process: answers stage, offload and dtype questions.

    Create it before the model (``DeepSpeedConfig("ds_config.json")``) and keep a reference: while it lives,
    :func:`is_deepspeed_zero3_enabled` returns True for a ZeRO-3 config, which model factories use to build under
    ``deepspeed.zero.Init``. ``resolve(args, ...)`` fills the ``"auto"`` values in place.
    """

    _hf_config: Any = None  # transformers' HfDeepSpeedConfig of the same config, kept alive with this one (ZeRO-3)

    def __init__(self, config: dict[str, Any] | str | os.PathLike) -> None:
        self.config = load_deepspeed_config(config)
        stage = get_value(self.config, "zero_optimization.stage", 0)
        if stage not in (0, 1, 2, 3):
            raise ValueError(f"deepspeed zero_optimization.stage={stage!r}: must be 0, 1, 2 or 3")
        self.mismatches: list[str] = []
        set_deepspeed_config(self)
        _register_with_transformers(self)

    # -- questions ---------------------------------------------------------------------------------------------
    def get_value(self, dotted: str, default: Any = None) -> Any:
        """The value at ``dotted`` (e.g. ``"zero_optimization.stage"``), or ``default``."""
        return get_value(self.config, dotted, default)

    def is_auto(self, dotted: str) -> bool:
        """True when the value at ``dotted`` is the string ``"auto"``."""
        return self.get_value(dotted) == AUTO

    def is_true(self, dotted: str) -> bool:
        """True only for an explicit true value."""
        return _as_bool(self.get_value(dotted)) is True

    def is_false(self, dotted: str) -> bool:
        """True only for an explicit false value."""
        return _as_bool(self.get_value(dotted)) is False

    @property
    def zero_stage(self) -> int:
        """The ZeRO stage (0 when the section is missing)."""
        return int(self.get_value("zero_optimization.stage", 0))

    def is_zero2(self) -> bool:
        """ZeRO stage 2."""
        return self.zero_stage == 2

    def is_zero3(self) -> bool:
        """ZeRO stage 3 (parameters sharded)."""
        return self.zero_stage == 3

    def is_offload(self) -> bool:
        """True when optimizer states or parameters are offloaded to the CPU or NVMe."""
        for section in ("offload_optimizer", "offload_param"):
            device = self.get_value(f"zero_optimization.{section}.device", "none")
            if device in ("cpu", "nvme"):
                return True
        return False

    def dtype_name(self) -> str:
        """The training dtype DeepSpeed will use: bf16, fp16 or fp32 (used for ``zero.Init``)."""
        if self.is_true("bf16.enabled"):
            return "bfloat16"
        return "float16" if self.is_true("fp16.enabled") or self.is_true("amp.enabled") else "float32"

    # -- filling -----------------------------------------------------------------------------------------------
    def fill_match(self, dotted: str, value: Any, arg_name: str, *, must_match: bool = True,
                   insert: bool = False) -> None:
        """Fill ``"auto"`` with ``value``; record a mismatch when an explicit value differs.

        ``insert`` adds the key when it is absent (its parent section is created too).
        """
        node, key = _node(self.config, dotted, create=insert)
        if node is None:
            return
        if key not in node:
            if insert:
                node[key] = value
            return
        current = node[key]
        if current == AUTO:
            node[key] = value
        elif must_match and not _same(current, value):
            self.mismatches.append(f"{dotted}: config value {current!r} != TrainingArguments.{arg_name} value "
                                   f"{value!r}")

    def fill_only(self, dotted: str, value: Any) -> None:
        """Replace an ``"auto"`` value (explicit values are the user's choice, not checked)."""
        node, key = _node(self.config, dotted)
        if node is not None and node.get(key) == AUTO:
            node[key] = value

    def trainer_config_process(self, args: Any) -> None:
        """Fill the ``"auto"`` values the arguments alone decide (batch sizes, accumulation, clipping, optimizer,
        precision), as upstream does when ``TrainingArguments(deepspeed=...)`` is built, so that ``from_pretrained``
        under ZeRO-3 sees a usable config. Contradictions are reported later, by :meth:`resolve`."""
        _fill_from_args(self, args, int(getattr(args, "world_size", 1)))
        _fill_precision(self, args)
        self.mismatches = []
        _register_with_transformers(self)  # again: transformers keeps its own copy of the (now filled) dict

    def resolve(self, args: Any, *, model: "nn.Module | None" = None, num_training_steps: int | None = None,
                world_size: int | None = None) -> dict[str, Any]:
        """Fill every ``"auto"`` from ``args`` (and ``model``/``num_training_steps``); raise on mismatches."""
        self.mismatches = []
        world = world_size if world_size is not None else int(getattr(args, "world_size", 1))
        _fill_from_args(self, args, world)
        _fill_precision(self, args)
        if num_training_steps is not None:
            self.fill_match("scheduler.params.total_num_steps", num_training_steps,
                            "max_steps (or the number of training steps computed from the data)")
            self.fill_match("scheduler.params.warmup_num_steps", args.get_warmup_steps(num_training_steps),
                            "warmup_steps (or warmup_ratio x steps)")
        _fill_hidden_size(self, model)
        if self.mismatches:
            lines = "\n  ".join(self.mismatches)
            raise ValueError(
                f"The DeepSpeed config contradicts the TrainingArguments in {len(self.mismatches)} place(s):\n  "
                f"{lines}\nSet these keys to \"auto\" in the DeepSpeed config (recommended) or change the "
                "TrainingArguments so both agree.")
        return self.config


def _same(a: Any, b: Any) -> bool:
    """Config values compare loosely: 1 == 1.0, [0.9, 0.999] == (0.9, 0.999), "true" == True."""
    if isinstance(b, bool) or isinstance(a, bool):
        return _as_bool(a) == _as_bool(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def _fill_from_args(cfg: DeepSpeedConfig, args: Any, world_size: int) -> None:
    """Batch sizes, accumulation, clipping, optimizer and scheduler hyper-parameters."""
    per_device, ga = args.per_device_train_batch_size, args.gradient_accumulation_steps
    auto_bs = bool(getattr(args, "auto_find_batch_size", False))
    cfg.fill_match("train_micro_batch_size_per_gpu", per_device, "per_device_train_batch_size",
                   must_match=not auto_bs, insert=True)
    cfg.fill_match("gradient_accumulation_steps", ga, "gradient_accumulation_steps", insert=True)
    cfg.fill_match("train_batch_size", per_device * ga * world_size,
                   f"per_device_train_batch_size x gradient_accumulation_steps x world_size ({world_size})",
                   must_match=not auto_bs, insert=True)
    cfg.fill_match("gradient_clipping", float(args.max_grad_norm or 0.0), "max_grad_norm", insert=True)
    cfg.fill_match("optimizer.params.lr", args.learning_rate, "learning_rate")
    cfg.fill_match("optimizer.params.betas", [args.adam_beta1, args.adam_beta2], "adam_beta1/adam_beta2")
    cfg.fill_match("optimizer.params.eps", args.adam_epsilon, "adam_epsilon")
    cfg.fill_match("optimizer.params.weight_decay", args.weight_decay, "weight_decay")
    cfg.fill_only("scheduler.params.warmup_min_lr", 0)
    cfg.fill_match("scheduler.params.warmup_max_lr", args.learning_rate, "learning_rate")
    if getattr(args, "save_on_each_node", False):
        cfg.config.setdefault("checkpoint", {})["use_node_local_storage"] = True


def _fill_precision(cfg: DeepSpeedConfig, args: Any) -> None:
    """fp16 (torch-amp-like), apex-like ``amp`` and bf16 sections from the trainer's precision flags."""
    wants_fp16 = bool(args.fp16 or getattr(args, "fp16_full_eval", False))
    backend = getattr(args, "half_precision_backend", "auto")
    apex = wants_fp16 and backend == "apex"
    amp = wants_fp16 and not apex
    bf16 = bool(args.bf16 or getattr(args, "bf16_full_eval", False))
    cfg.fill_match("fp16.enabled", amp, "fp16 (or fp16_full_eval)")
    cfg.fill_match("amp.enabled", apex, "fp16 with half_precision_backend='apex'")
    cfg.fill_match("amp.opt_level", args.fp16_opt_level, "fp16_opt_level")
    cfg.fill_match("bf16.enabled", bf16, "bf16 (or bf16_full_eval)")
    # A precision asked for on the command line and absent from the config is added: the arguments rule.
    if args.fp16 and not apex and "fp16" not in cfg.config:
        cfg.config["fp16"] = {"enabled": True}
    if args.bf16 and "bf16" not in cfg.config:
        cfg.config["bf16"] = {"enabled": True}


def infer_hidden_size(model: "nn.Module") -> int | None:
    """``model.config.hidden_size``, else the largest of ``config.hidden_sizes``, else the largest Linear input."""
    config = getattr(model, "config", None)
    for source in (config, getattr(config, "text_config", None)):
        size = _config_get(source, "hidden_size")
        if isinstance(size, int):
            return size
        sizes = _config_get(source, "hidden_sizes")
        if sizes:
            return int(max(sizes))
    from torch import nn  # TrainingArguments reads this module without torch

    widths = [m.in_features for m in model.modules() if isinstance(m, nn.Linear)]
    return max(widths) if widths else None


def _config_get(config: Any, name: str) -> Any:
    if config is None:
        return None
    return config.get(name) if isinstance(config, dict) else getattr(config, name, None)


def _fill_hidden_size(cfg: DeepSpeedConfig, model: "nn.Module | None") -> None:
    """``reduce_bucket_size`` = h^2, ``stage3_prefetch_bucket_size`` = 0.9 h^2, persistence threshold = 10 h."""
    autos = [key for key in HIDDEN_SIZE_KEYS if cfg.is_auto(key)]
    if not autos or model is None:
        return
    hidden = infer_hidden_size(model)
    if hidden is None:
        raise ValueError(
            f"The DeepSpeed config has \"auto\" for {autos}, which are sized from the model's hidden size, but the "
            "model has no config.hidden_size / config.hidden_sizes and no nn.Linear layer: replace these \"auto\" "
            "values with integers of your choice.")
    cfg.fill_only("zero_optimization.reduce_bucket_size", hidden * hidden)
    cfg.fill_only("zero_optimization.stage3_prefetch_bucket_size", int(0.9 * hidden * hidden))
    cfg.fill_only("zero_optimization.stage3_param_persistence_threshold", 10 * hidden)


def remaining_auto_keys(config: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the values still ``"auto"`` (DeepSpeed itself would reject them)."""
    found = []
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            found.extend(remaining_auto_keys(value, name + "."))
        elif value == AUTO:
            found.append(name)
    return found


def resolve_deepspeed_config(config: dict[str, Any] | str | os.PathLike | DeepSpeedConfig, args: Any, *,
                             model: "nn.Module | None" = None, num_training_steps: int | None = None,
                             world_size: int | None = None) -> dict[str, Any]:
    """A resolved copy of ``config``: every ``"auto"`` filled from ``args`` (one ``ValueError`` for all mismatches).

    ``num_training_steps`` fills the scheduler's ``total_num_steps``/``warmup_num_steps``; ``model`` the hidden-size
    keys. The input is never modified.
    """
    source = config.config if isinstance(config, DeepSpeedConfig) else config
    holder = DeepSpeedConfig.__new__(DeepSpeedConfig)  # a detached copy: not registered globally
    holder.config = load_deepspeed_config(source)
    holder.mismatches = []
    return holder.resolve(args, model=model, num_training_steps=num_training_steps, world_size=world_size)


# -- the process-wide config ----------------------------------------------------------------------------------------
def set_deepspeed_config(config: DeepSpeedConfig) -> None:
    """Make ``config`` the live one (held weakly: it stays live while the caller keeps a reference)."""
    global _global_config
    _global_config = weakref.ref(config)


def unset_deepspeed_config() -> None:
    """Forget the live config (tests, or switching to another backend in the same process)."""
    global _global_config
    _global_config = None


def get_deepspeed_config() -> DeepSpeedConfig | None:
    """The live :class:`DeepSpeedConfig`, or None."""
    return _global_config() if _global_config is not None else None


def is_deepspeed_zero3_enabled() -> bool:
    """True while a live :class:`DeepSpeedConfig` asks for ZeRO stage 3."""
    live = get_deepspeed_config()
    return live is not None and live.is_zero3()


def _register_with_transformers(config: DeepSpeedConfig) -> None:
    """Let ``transformers`` models (``from_pretrained``) see ZeRO-3 too, when transformers is installed."""
    if not config.is_zero3():
        return
    try:
        from transformers.integrations import HfDeepSpeedConfig
    except Exception:  # transformers (or its deepspeed glue) absent: nothing to tell
        return
    try:
        config._hf_config = HfDeepSpeedConfig(config.config)  # kept alive as long as ours
    except Exception as err:  # a transformers/deepspeed version mismatch must not break trainwell
        logger.info("could not register the ZeRO-3 config with transformers: %s", err)


#: upstream's name (``transformers.integrations.HfDeepSpeedConfig``): the same object
HfDeepSpeedConfig = DeepSpeedConfig

__all__ = [
    "DeepSpeedConfig", "HfDeepSpeedConfig", "DS_TO_TRAINER_SCHEDULER", "get_deepspeed_config", "infer_hidden_size",
    "is_deepspeed_zero3_enabled", "load_deepspeed_config", "remaining_auto_keys", "resolve_deepspeed_config",
    "set_deepspeed_config", "unset_deepspeed_config",
]
