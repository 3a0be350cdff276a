"""The ``optim`` names backed by optional packages: bitsandbytes, schedulefree, grokadamw, galore-torch, apollo-torch.

Each factory takes ``(args, model)`` and returns ``(optimizer_class, kwargs)`` with upstream's keyword mapping (see
``transformers.trainer_optimizer``); ``optim_args`` is merged over these kwargs by :mod:`trainwell.optim.factory`. A missing
package raises ``ImportError`` naming the pip package (and the extra of trainwell that installs it); names that need
a device or a training step trainwell does not have raise ``NotImplementedError`` saying what to use instead. The
low-rank optimizers (GaLore, APOLLO) return their own parameter groups under ``"params"``: the weights of the
``nn.Linear`` modules named by ``optim_target_modules`` get the projection settings, every other parameter a plain
group.
"""

from __future__ import annotations

import importlib.util
import re
from typing import Any, Callable

from torch import nn

Factory = Callable[[Any, "nn.Module | None"], tuple[type, dict[str, Any]]]


def _need(module: str, package: str, name: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ImportError(f"optim={name!r} needs the `{package}` package: pip install {package} "
                          f"(or pip install 'trainwell[{package}]'), or pick another optim.")


def _name(args: Any) -> str:
    return str(getattr(args.optim, "value", args.optim))


def _adam(args: Any) -> dict[str, Any]:
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


def _optim_args(args: Any) -> dict[str, Any]:
    from .factory import parse_optim_args

    return parse_optim_args(getattr(args, "optim_args", None))


# --- bitsandbytes: AdamW / Lion / RMSprop / AdEMAMix, 8- or 32-bit, paged or not (CPU and CUDA) -------------------
def _bitsandbytes(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    name = _name(args)
    _need("bitsandbytes", "bitsandbytes", name)
    import bitsandbytes.optim as bnb

    kwargs: dict[str, Any] = {"optim_bits": 8 if "8bit" in name else 32}
    if "rmsprop" in name:
        return bnb.RMSprop, kwargs
    kwargs["is_paged"] = "paged" in name
    if "lion" in name:
        return bnb.Lion, {**kwargs, "betas": (args.adam_beta1, args.adam_beta2)}
    if "ademamix" in name:
        return bnb.AdEMAMix, {**kwargs, "betas": (args.adam_beta1, args.adam_beta2, 0.9999), "alpha": 5.0,
                              "eps": args.adam_epsilon}
    return bnb.AdamW, {**kwargs, **_adam(args)}


# --- schedule-free (the optimizer itself replaces the schedule; needs optimizer.train()/eval()) -----------------
def _schedule_free(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    name = _name(args)
    _need("schedulefree", "schedulefree", name)
    import schedulefree

    kwargs: dict[str, Any] = {"weight_decay": args.weight_decay, "weight_lr_power": 2.0, "r": 0.0}
    if name == "schedule_free_radam":
        if not hasattr(schedulefree, "RAdamScheduleFree"):
            raise ImportError("optim='schedule_free_radam' needs schedulefree>=1.4: pip install -U schedulefree")
        return schedulefree.RAdamScheduleFree, {**_adam(args), **kwargs}
    kwargs["warmup_steps"] = args.warmup_steps
    if name == "schedule_free_adamw":
        return schedulefree.AdamWScheduleFree, {**_adam(args), **kwargs}
    return schedulefree.SGDScheduleFree, kwargs


def _grokadamw(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    _need("grokadamw", "grokadamw", "grokadamw")
    from grokadamw import GrokAdamW

    return GrokAdamW, {"alpha_init": 0.98, "lamb": 2.0, "gamma": 0.1, "grokking_signal_decay_rate": 0.1,
                       "gradient_clipping": 1.0}


# --- low-rank projections: GaLore and APOLLO ---------------------------------------------------------------------
_LOW_RANK_KEYS = {"galore": ("rank", "update_proj_gap", "scale", "proj_type"),
                  "apollo": ("rank", "proj", "scale_type", "update_proj_gap", "scale", "proj_type")}


def _target_weights(model: nn.Module, targets: str | list[str], name: str) -> list[str]:
    all_linear = isinstance(targets, str) and targets.replace("_", "-") == "all-linear"
    found = []
    for module_name, module in model.named_modules():
        if isinstance(targets, str):
            matched = all_linear or re.fullmatch(targets, module_name) is not None
        else:
            matched = module_name in targets or any(module_name.endswith(f".{t}") or t in module_name
                                                    for t in targets)
        if matched and isinstance(module, nn.Linear):
            found.append(f"{module_name}.weight")
    if not found:
        raise ValueError(f"optim={name!r}: optim_target_modules={targets!r} matches no nn.Linear module of "
                         f"{type(model).__name__}; name linear modules (or a regex, or 'all-linear').")
    return found


def _low_rank(args: Any, model: nn.Module | None, cls: type, projection: dict[str, Any]) -> dict[str, Any]:
    name = _name(args)
    if name.endswith("layerwise"):
        raise NotImplementedError(f"optim={name!r} steps each parameter inside backward, which trainwell's loop "
                                  f"does not do; use optim={name[:-len('_layerwise')]!r} instead.")
    if args.optim_target_modules is None:
        raise ValueError(f"optim={name!r} needs optim_target_modules (the linear modules to project), e.g. "
                         "optim_target_modules=['attn', 'mlp'] or 'all-linear'.")
    if model is None:
        raise ValueError(f"optim={name!r} needs the model to find optim_target_modules in.")
    targets = set(_target_weights(model, args.optim_target_modules, name))
    family = "galore" if name.startswith("galore") else "apollo"
    extra = _optim_args(args)
    projection = {**projection, **{k: extra[k] for k in _LOW_RANK_KEYS[family] if k in extra}}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return {"params": [{"params": [p for n, p in named if n not in targets]},
                       {"params": [p for n, p in named if n in targets], **projection}],
            "_consumed_optim_args": set(_LOW_RANK_KEYS[family])}


def _galore(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    name = _name(args)
    _need("galore_torch", "galore-torch", name)
    import galore_torch

    base = name.replace("_layerwise", "")
    cls = {"galore_adamw": galore_torch.GaLoreAdamW, "galore_adamw_8bit": galore_torch.GaLoreAdamW8bit,
           "galore_adafactor": galore_torch.GaLoreAdafactor}[base]
    kwargs = _low_rank(args, model, cls, {"rank": 128, "update_proj_gap": 200, "scale": 0.25, "proj_type": "std"})
    if base == "galore_adafactor":
        kwargs.update(scale_parameter=False, relative_step=False)
    return cls, kwargs


def _apollo(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    _need("apollo_torch", "apollo-torch", _name(args))
    from apollo_torch import APOLLOAdamW

    projection = {"rank": 128, "proj": "random", "scale_type": "channel", "update_proj_gap": 200, "scale": 1.0,
                  "proj_type": "std", **_adam(args)}
    return APOLLOAdamW, _low_rank(args, model, APOLLOAdamW, projection)


def _torchao(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    name = _name(args)
    _need("torchao", "torchao", name)
    from torchao.optim import AdamW4bit, AdamW8bit

    cls = AdamW4bit if name == "adamw_torch_4bit" else AdamW8bit
    return cls, {"block_size": 256, "bf16_stochastic_round": False, **_adam(args)}


def _stable_adamw(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    _need("optimi", "torch-optimi", "stable_adamw")
    from optimi import StableAdamW

    return StableAdamW, {**_adam(args), "weight_decay": args.weight_decay}


def _refused(reason: str) -> Factory:
    def factory(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
        raise NotImplementedError(f"optim={_name(args)!r} {reason}")

    return factory


_BNB = ("adamw_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit", "paged_lion_32bit",
        "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "ademamix", "ademamix_8bit",
        "paged_ademamix_32bit", "paged_ademamix_8bit")

EXTRA_FACTORIES: dict[str, Factory] = {
    **{name: _bitsandbytes for name in _BNB},
    **{name: _schedule_free for name in ("schedule_free_radam", "schedule_free_adamw", "schedule_free_sgd")},
    "grokadamw": _grokadamw,
    **{name: _galore for name in ("galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
                                  "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise")},
    **{name: _apollo for name in ("apollo_adamw", "apollo_adamw_layerwise")},
    "lomo": _refused("fuses the backward pass into the update (lomo-optim's fused_backward), which trainwell's "
                     "loop does not do; use optim='adafactor' or 'adamw_8bit' for a small optimizer state."),
    "adalomo": _refused("fuses the backward pass into the update (lomo-optim's fused_backward), which trainwell's "
                        "loop does not do; use optim='adafactor' or 'adamw_8bit' for a small optimizer state."),
    "adamw_torch_xla": _refused("needs a TPU and torch_xla; use optim='adamw_torch' on this device."),
    "adamw_torch_npu_fused": _refused("needs an Ascend NPU and torch_npu; use optim='adamw_torch_fused'."),
    "adamw_anyprecision": _refused("needs the `torchdistx` package, which has no build for this PyTorch; use "
                                   "optim='adamw_torch' (or bf16=True for low-precision training)."),
    "adamw_torch_4bit": _torchao,
    "adamw_torch_8bit": _torchao,
    "stable_adamw": _stable_adamw,
}
