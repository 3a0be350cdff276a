"""What an ``accelerate launch`` configuration asks for, mapped onto :class:`~trainwell.TrainingArguments`.

``accelerate launch --config_file cfg.yaml train.py`` starts the processes (torchrun's ``RANK``/``WORLD_SIZE``,
read by :mod:`trainwell.runtime.distributed`) and passes the configuration through environment variables
(``accelerate/utils/launch.py``): ``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_USE_CPU``, ``ACCELERATE_DYNAMO_*``,
``ACCELERATE_USE_FSDP`` with its ``FSDP_*`` variables, ``ACCELERATE_USE_DEEPSPEED`` with
``ACCELERATE_DEEPSPEED_CONFIG_FILE`` or the plugin variables (``ACCELERATE_DEEPSPEED_ZERO_STAGE``, offload devices,
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, ``ACCELERATE_GRADIENT_CLIPPING``...). The upstream Trainer builds its
``Accelerator`` from them; trainwell maps them onto the arguments when the Trainer is created
(:func:`apply_accelerate_env`), so the run trains with the precision and sharding the configuration asks for.

The environment is read only under ``accelerate launch``, recognised by ``ACCELERATE_MIXED_PRECISION`` (every
accelerate launcher sets it; an ``Accelerator`` created in the process leaves other variables behind, not this one).

Precedence: a value the user set in ``TrainingArguments`` is never overridden. A launcher setting fills an
argument the user left at its default; when both ask for different things (``fp16=True`` under
``mixed_precision: bf16``, ``fsdp="shard_grad_op"`` under ``FULL_SHARD``, two DeepSpeed configurations...) the
Trainer stops with an error naming both. A setting trainwell cannot honour (fp8, Megatron-LM, tensor/context
parallelism, FSDP activation-checkpointing offload, ignored modules, dynamo ``fullgraph``/``dynamic``) is an error
too: nothing falls back silently to fp32 DDP.
"""

from __future__ import annotations

import logging
import os
import importlib.util
import sys
from collections.abc import Mapping
from typing import Any

import torch.distributed as dist

from ..utils.option_enums import FSDPOption
from .distributed import close_process_group_at_exit, read_launch_env

logger = logging.getLogger(__name__)

__all__ = ["accelerate_settings", "apply_accelerate_env", "ensure_accelerator_state", "ensure_partial_state"]

_TRUE, _FALSE = ("1", "true", "yes", "on", "y", "t"), ("0", "false", "no", "off", "n", "f", "", "none")
# FSDP_SHARDING_STRATEGY: accelerate writes the name, older configs the torch enum value.
_SHARDING = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "no_shard",
             "HYBRID_SHARD": "hybrid_shard", "HYBRID_SHARD_ZERO2": "hybrid_shard_zero2",
             "1": "full_shard", "2": "shard_grad_op", "3": "no_shard", "4": "hybrid_shard", "5": "hybrid_shard_zero2"}
_WRAP_POLICIES = ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP")
LAUNCH_MARKER = "ACCELERATE_MIXED_PRECISION"  # set by `accelerate launch` whatever the config
_FIX = "change the accelerate config (accelerate config / --config_file) or the TrainingArguments so they agree"


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    value = env.get(name)
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"environment variable {name}={value!r} is not a boolean (true/false); fix the accelerate "
                     "config or unset the variable")


def _number(env: Mapping[str, str], name: str, kind: type) -> Any:
    value = env.get(name)
    if value in (None, ""):
        return None
    try:
        return kind(value)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise ValueError(f"environment variable {name}={value!r} is not {what}; fix the accelerate config or unset "
                         "the variable") from None


def _unsupported(env: Mapping[str, str]) -> list[str]:
    """The settings of the launch that trainwell cannot honour, each with its variable and the fix."""
    problems = []
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if precision not in ("no", "fp16", "bf16", ""):
        problems.append(f"ACCELERATE_MIXED_PRECISION={precision!r}: trainwell trains in fp32, fp16 or bf16; set "
                        "mixed_precision to 'no', 'fp16' or 'bf16' in the accelerate config")
    if _flag(env, "ACCELERATE_USE_MEGATRON_LM"):
        problems.append("ACCELERATE_USE_MEGATRON_LM=true: Megatron-LM is not supported by trainwell; use FSDP or "
                        "DeepSpeed (distributed_type: FSDP / DEEPSPEED)")
    if _flag(env, "ACCELERATE_USE_PARALLELISM_CONFIG"):
        for size in ("TP_SIZE", "CP_SIZE", "SP_SIZE"):
            value = _number(env, f"PARALLELISM_CONFIG_{size}", int)
            if value is not None and value > 1:
                problems.append(f"PARALLELISM_CONFIG_{size}={value}: tensor/context/sequence parallelism is not "
                                "supported by trainwell; set it to 1 in the accelerate config")
    if _flag(env, "ACCELERATE_USE_FSDP"):
        if _flag(env, "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"):
            problems.append("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD=true: offloading checkpointed activations is not "
                            "supported; set fsdp_activation_checkpointing_offload: false")
        if env.get("FSDP_IGNORED_MODULES"):
            problems.append(f"FSDP_IGNORED_MODULES={env['FSDP_IGNORED_MODULES']!r}: ignored modules are not "
                            "supported; remove fsdp_ignored_modules from the accelerate config")
        policy = env.get("FSDP_AUTO_WRAP_POLICY")
        if policy and policy.upper() not in _WRAP_POLICIES:
            problems.append(f"FSDP_AUTO_WRAP_POLICY={policy!r}: expected one of {list(_WRAP_POLICIES)}")
        if env.get("FSDP_SHARDING_STRATEGY") and env["FSDP_SHARDING_STRATEGY"].upper() not in _SHARDING:
            problems.append(f"FSDP_SHARDING_STRATEGY={env['FSDP_SHARDING_STRATEGY']!r}: expected one of "
                            f"{sorted(k for k in _SHARDING if not k.isdigit())}")
    if _flag(env, "ACCELERATE_USE_DEEPSPEED") and env.get("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES"):
        problems.append("ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES: ZeRO-3 MoE leaf modules are not supported; "
                        "remove deepspeed_moe_layer_cls_names from the accelerate config")
    for name in ("ACCELERATE_DYNAMO_USE_FULLGRAPH", "ACCELERATE_DYNAMO_USE_DYNAMIC",
                 "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION"):
        if _dynamo_backend(env) and _flag(env, name):
            problems.append(f"{name}=true: trainwell compiles with torch_compile_backend/torch_compile_mode only; "
                            f"set dynamo_config's {name[len('ACCELERATE_DYNAMO_'):].lower()} to false")
    return problems


def _dynamo_backend(env: Mapping[str, str]) -> str | None:
    backend = env.get("ACCELERATE_DYNAMO_BACKEND", "NO").strip()
    return None if backend.upper() in ("", "NO") else backend.lower()


def _fsdp_settings(env: Mapping[str, str]) -> tuple[list[str], dict[str, Any]]:
    """``(fsdp options, fsdp_config)`` for ``ACCELERATE_USE_FSDP=true``."""
    version = _number(env, "FSDP_VERSION", int) or 1
    if version >= 2 and "FSDP_RESHARD_AFTER_FORWARD" in env:
        # accelerate's FSDP2 plugin shards by reshard_after_forward and ignores FSDP_SHARDING_STRATEGY
        strategy = "full_shard" if _flag(env, "FSDP_RESHARD_AFTER_FORWARD", True) else "shard_grad_op"
    else:
        strategy = _SHARDING[env.get("FSDP_SHARDING_STRATEGY", "FULL_SHARD").upper() or "FULL_SHARD"]
    options = [strategy]
    if _flag(env, "FSDP_OFFLOAD_PARAMS"):
        options.append("offload")
    config: dict[str, Any] = {"version": version}
    policy = (env.get("FSDP_AUTO_WRAP_POLICY") or "NO_WRAP").upper()
    if policy == "TRANSFORMER_BASED_WRAP":
        options.append("auto_wrap")
        names = [n.strip() for n in env.get("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if n.strip()]
        if names:  # without names the model's _no_split_modules are wrapped, as accelerate does
            config["transformer_layer_cls_to_wrap"] = names
    elif policy == "SIZE_BASED_WRAP":
        options.append("auto_wrap")
        config["min_num_params"] = _number(env, "FSDP_MIN_NUM_PARAMS", int) or int(1e8)
    for key in ("activation_checkpointing", "forward_prefetch", "cpu_ram_efficient_loading", "sync_module_states",
                "use_orig_params"):
        if f"FSDP_{key.upper()}" in env:
            config[key] = _flag(env, f"FSDP_{key.upper()}")
    for key in ("backward_prefetch", "state_dict_type"):
        if env.get(f"FSDP_{key.upper()}"):
            config[key] = env[f"FSDP_{key.upper()}"]
    return options, config


def _deepspeed_settings(env: Mapping[str, str]) -> str | dict[str, Any]:
    """The DeepSpeed config of ``ACCELERATE_USE_DEEPSPEED=true``: the config file, or one built from the plugin."""
    if env.get("ACCELERATE_DEEPSPEED_CONFIG_FILE"):
        return env["ACCELERATE_DEEPSPEED_CONFIG_FILE"]
    stage = _number(env, "ACCELERATE_DEEPSPEED_ZERO_STAGE", int)
    zero: dict[str, Any] = {"stage": 2 if stage is None else stage}
    for what in ("optimizer", "param"):
        device = env.get(f"ACCELERATE_DEEPSPEED_OFFLOAD_{what.upper()}_DEVICE", "none").lower()
        if device not in ("", "none"):
            zero[f"offload_{what}"] = {"device": device}
    if "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL" in env:
        zero["stage3_gather_16bit_weights_on_model_save"] = _flag(env, "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL")
    # "auto" values are filled from the TrainingArguments (batch size, accumulation, clipping, precision)
    return {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "zero_optimization": zero}


def accelerate_settings(environ: Mapping[str, str] | None = None) -> dict[str, tuple[Any, str]]:
    """What the ``accelerate launch`` environment asks for: ``{argument: (value, variable it came from)}``.

    Only settings that differ from a plain run are listed (``mixed_precision: no`` lists nothing). Raises
    ``ValueError`` naming every setting trainwell cannot honour.
    """
    env = os.environ if environ is None else environ
    problems = _unsupported(env)
    if problems:
        raise ValueError("accelerate launch asks for what trainwell cannot do:\n  - " + "\n  - ".join(problems))
    settings: dict[str, tuple[Any, str]] = {}
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if precision in ("fp16", "bf16"):
        settings[precision] = (True, f"ACCELERATE_MIXED_PRECISION={precision}")
    if _flag(env, "ACCELERATE_USE_CPU"):
        settings["use_cpu"] = (True, "ACCELERATE_USE_CPU=true")
    backend = _dynamo_backend(env)
    if backend:
        settings["torch_compile_backend"] = (backend, f"ACCELERATE_DYNAMO_BACKEND={env['ACCELERATE_DYNAMO_BACKEND']}")
        mode = env.get("ACCELERATE_DYNAMO_MODE", "default")
        if mode not in ("", "default"):
            settings["torch_compile_mode"] = (mode, f"ACCELERATE_DYNAMO_MODE={mode}")
    steps = _number(env, "ACCELERATE_GRADIENT_ACCUMULATION_STEPS", int)
    if steps is not None:
        settings["gradient_accumulation_steps"] = (steps, f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS={steps}")
    clipping = env.get("ACCELERATE_GRADIENT_CLIPPING", "").strip().lower()
    if clipping not in ("", "none", "auto"):
        settings["max_grad_norm"] = (_number(env, "ACCELERATE_GRADIENT_CLIPPING", float),
                                     f"ACCELERATE_GRADIENT_CLIPPING={clipping}")
    use_fsdp, use_deepspeed = _flag(env, "ACCELERATE_USE_FSDP"), _flag(env, "ACCELERATE_USE_DEEPSPEED")
    if use_fsdp and use_deepspeed:
        raise ValueError("ACCELERATE_USE_FSDP and ACCELERATE_USE_DEEPSPEED are both true: the launch asks for two "
                         "sharding backends; keep one distributed_type in the accelerate config")
    if use_fsdp:
        options, config = _fsdp_settings(env)
        source = "ACCELERATE_USE_FSDP=true (FSDP_* variables)"
        settings["fsdp"] = (options, source)
        settings["fsdp_config"] = (config, source)
    if use_deepspeed:
        ds_config = _deepspeed_settings(env)  # a file's path, or the settings as a dict
        source = ("ACCELERATE_DEEPSPEED_CONFIG_FILE" if isinstance(ds_config, str)
                  else "ACCELERATE_USE_DEEPSPEED=true (ACCELERATE_DEEPSPEED_* variables)")
        settings["deepspeed"] = (ds_config, source)
    return settings


def _conflict(name: str, current: Any, wanted: Any, source: str) -> str:
    return f"TrainingArguments.{name}={current!r} but the launch asks for {wanted!r} ({source})"


def _apply_one(args: Any, name: str, value: Any, source: str, problems: list[str]) -> bool:
    """Set one argument from the launch unless the user set it to something else; True when it changed."""
    if name in ("fp16", "bf16"):
        other = "bf16" if name == "fp16" else "fp16"
        if getattr(args, other, False):
            problems.append(_conflict(other, True, f"{name}=True", source))
            return False
    elif name == "torch_compile_backend":
        if getattr(args, "torch_compile", False) and args.torch_compile_backend not in (None, value):
            problems.append(_conflict(name, args.torch_compile_backend, value, source))
            return False
        args.torch_compile = True
    elif name == "fsdp":
        return _apply_fsdp(args, value, source, problems)
    elif name == "fsdp_config":
        return _apply_fsdp_config(args, value, source, problems)
    elif name == "deepspeed":
        return _apply_deepspeed(args, value, source, problems)
    else:
        defaults = {"gradient_accumulation_steps": 1, "max_grad_norm": 1.0, "torch_compile_mode": None,
                    "use_cpu": False}
        current = getattr(args, name)
        if current != defaults[name] and current != value:
            problems.append(_conflict(name, current, value, source))
            return False
    changed = getattr(args, name, None) != value
    setattr(args, name, value)
    if name == "use_cpu" and changed:
        args.dataloader_pin_memory = False  # as TrainingArguments does for use_cpu
        vars(args).pop("_runtime_cache", None)  # the device was resolved before: resolve it again on the CPU
    return changed


def _apply_fsdp(args: Any, options: list[str], source: str, problems: list[str]) -> bool:
    if getattr(args, "deepspeed", None):
        problems.append(f"TrainingArguments.deepspeed is set but the launch asks for FSDP ({source}); keep one")
        return False
    current = {getattr(o, "value", o) for o in (args.fsdp.split() if isinstance(args.fsdp, str) else args.fsdp or [])}
    if current and current != set(options):
        problems.append(_conflict("fsdp", " ".join(sorted(current)), " ".join(options), source))
        return False
    args.fsdp = [FSDPOption(option) for option in options]
    return not current


def _apply_fsdp_config(args: Any, config: dict[str, Any], source: str, problems: list[str]) -> bool:
    merged = dict(args.fsdp_config or {})
    unset = (None, 0, False)  # TrainingArguments' defaults (min_num_params=0)
    for key, value in config.items():
        if merged.get(key) not in unset and merged[key] != value:
            problems.append(_conflict(f"fsdp_config[{key!r}]", merged[key], value, source))
        else:
            merged[key] = value
    if merged.get("min_num_params") and merged.get("transformer_layer_cls_to_wrap"):
        problems.append(f"fsdp_config has min_num_params={merged['min_num_params']} and the launch wraps "
                        f"{merged['transformer_layer_cls_to_wrap']} ({source}); they exclude each other")
    changed = merged != args.fsdp_config
    args.fsdp_config = merged
    return changed


def _apply_deepspeed(args: Any, config: str | dict[str, Any], source: str, problems: list[str]) -> bool:
    if args.fsdp:
        problems.append(f"TrainingArguments.fsdp={args.fsdp} but the launch asks for DeepSpeed ({source}); keep one")
        return False
    current = args.deepspeed
    if current is None:
        args.deepspeed = config
        return True
    same = current == config or isinstance(current, str) and isinstance(config, str) and (
        os.path.realpath(current) == os.path.realpath(config))
    if not same:
        shown = config if isinstance(config, str) else f"zero stage {config['zero_optimization']['stage']}"
        problems.append(f"TrainingArguments.deepspeed={current!r} and the launch's DeepSpeed config ({shown}, "
                        f"{source}) are two DeepSpeed configurations; pass --deepspeed only or use only the "
                        "accelerate config")
    return False


def apply_accelerate_env(args: Any, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Fill the arguments the user left at their defaults from the ``accelerate launch`` environment.

    Called by the Trainer when it is created, before the device and the backend are resolved. Returns the
    arguments it changed (``{}`` outside ``accelerate launch``). Raises ``ValueError`` listing every setting that
    conflicts with a value set in the arguments, or that trainwell cannot honour. Calling it again is harmless.
    """
    env = os.environ if environ is None else environ
    # Every accelerate launcher sets ACCELERATE_MIXED_PRECISION; an in-process Accelerator never does, but it does
    # leave ACCELERATE_USE_DEEPSPEED / ACCELERATE_USE_FSDP behind, which must not reconfigure a later Trainer.
    if LAUNCH_MARKER not in env:
        return {}
    settings = accelerate_settings(env)
    problems: list[str] = []
    changed = {name: value for name, (value, source) in settings.items()
               if _apply_one(args, name, value, source, problems)}
    if problems:
        raise ValueError("The accelerate launch configuration conflicts with the TrainingArguments:\n  - "
                         + "\n  - ".join(problems) + f"\n{_FIX}.")
    check = getattr(args, "_check_precision", None)  # what TrainingArguments checks for fp16/bf16 it was given
    if callable(check) and ({"fp16", "bf16", "use_cpu"} & set(changed)):
        try:
            check()
        except ValueError as err:
            sources = ", ".join(settings[name][1] for name in ("fp16", "bf16", "use_cpu") if name in changed)
            raise ValueError(f"The accelerate launch configuration ({sources}) cannot be honoured here: {err} "
                             "Change mixed_precision in the accelerate config.") from None
    if changed:
        logger.info("accelerate launch configuration applied: %s",
                    ", ".join(f"{name}={value!r}" for name, value in changed.items()))
    return changed


def ensure_partial_state(args: Any) -> None:
    """Set up accelerate's process-wide ``PartialState`` once accelerate is imported, as upstream's
    ``TrainingArguments`` does when it is built (``_setup_devices``): code between the arguments and the Trainer
    (``accelerate.logging.get_logger(...).warning``, ``PartialState().is_main_process``) finds it.

    Only once accelerate is imported (a script or library that logs through it has imported it): a plain run, and
    ``TrainingArguments()`` on its torch-free path, never load accelerate. A state that already exists is kept (an
    ``Accelerator`` the script made keeps its settings). In one process the state is made now, with upstream's ``cpu`` (``use_cpu`` or ``ACCELERATE_USE_CPU``): no process group, the same
    device set-up upstream makes. Under a launcher of several processes trainwell's arguments create no process
    group when built (the device is resolved at its first use): the state is made then, after the group exists, and
    adopts it (see ``RuntimeProperties._set_up_runtime``); a group it would have to create itself (DeepSpeed's,
    made with its engine) is left to the Trainer (:func:`ensure_accelerator_state`).
    """
    if "accelerate" not in sys.modules:
        return  # only code that has imported accelerate can log through it; a plain run never loads it
    from accelerate.state import PartialState

    if PartialState._shared_state:
        return
    if read_launch_env(args.local_rank).distributed and not (dist.is_available() and dist.is_initialized()):
        return
    cpu = bool(args.use_cpu) or os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes", "y",
                                                                                          "on", "t")
    try:
        PartialState(cpu=cpu)
    except Exception as error:  # an environment accelerate reads otherwise: the Trainer sets the state up later
        logger.info("accelerate's PartialState was not set up with the arguments (%s: %s)", type(error).__name__,
                    error)


def ensure_accelerator_state(args: Any) -> None:
    """Set up accelerate's process-wide ``AcceleratorState`` as upstream's Trainer does when it creates its
    ``Accelerator``, so libraries that read it (``accelerate.utils.set_seed(seed, device_specific=True)`` in TRL's
    GRPO/RLOO trainers, ``AcceleratorState().process_index``...) find this process's rank, device and precision.

    trainwell itself never reads it. Nothing happens when accelerate is not installed or a state already exists (an
    ``Accelerator`` the script created keeps its settings). Call it after the process group is set up
    (``args.device``): accelerate then adopts the group instead of creating one. Under DeepSpeed ``args.device``
    makes no group and accelerate creates it here: for the Trainer, so trainwell closes it at exit as its own.
    """
    if importlib.util.find_spec("accelerate") is None or "accelerate" not in sys.modules:
        return  # a library that reads the state (TRL) has imported accelerate; a plain run never loads it
    from accelerate.state import AcceleratorState

    if AcceleratorState._shared_state.get("_mixed_precision") is not None:  # already set up by an Accelerator
        return
    precision = "fp16" if args.fp16 else ("bf16" if args.bf16 else "no")
    cpu = args.device.type == "cpu"
    had_group = dist.is_available() and dist.is_initialized()
    try:
        from accelerate.utils import TorchDynamoPlugin

        # the plugin an Accelerator() would pass: an upstream Trainer created later in this process reuses this state
        # and reads its dynamo_plugin
        AcceleratorState(mixed_precision=precision, cpu=cpu, dynamo_plugin=TorchDynamoPlugin(), _from_accelerator=True)
        if not had_group and dist.is_available() and dist.is_initialized():  # accelerate made the group for this
            close_process_group_at_exit()  # Trainer (under DeepSpeed, args.device makes none): trainwell closes it
    except Exception as error:  # a launch set-up accelerate handles otherwise (its DeepSpeed plugin): trainwell's own
        logger.info("accelerate's AcceleratorState was not set up (%s: %s); libraries reading it outside the "
                    "Trainer may fail", type(error).__name__, error)
