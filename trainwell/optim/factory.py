"""The optimizer factory the Trainer calls, parameter groups, and a compact Adafactor.

``create_optimizer(model, args)`` builds the optimizer named by ``args.optim`` over two parameter groups: the
weights that get ``args.weight_decay`` and the ones that never do (biases and normalisation-layer weights), as
upstream's ``Trainer.create_optimizer`` does. ``args`` only needs the fields ``optim``, ``learning_rate``,
``weight_decay``, ``adam_beta1``, ``adam_beta2``, ``adam_epsilon`` and ``optim_args``.

``Trainer.get_optimizer_cls_and_kwargs`` (the public hook a subclass overrides) is :func:`get_optimizer_cls_and_kwargs`;
``Trainer.create_optimizer`` builds :func:`build_param_groups` and hands the hook's result to
:func:`instantiate_optimizer`.
"""

from __future__ import annotations

import inspect
import math
import re
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch import nn

from .names import SUPPORTED_OPTIMIZERS, parse_optim_args
from .extras import EXTRA_FACTORIES

if TYPE_CHECKING:
    from torch.optim import Optimizer

__all__ = [
    "Adafactor",
    "build_param_groups",
    "create_optimizer",
    "get_decay_parameter_names",
    "get_optimizer_cls_and_kwargs",
    "instantiate_optimizer",
    "is_optimizer_factory",
    "parse_optim_args",
    "SUPPORTED_OPTIMIZERS",
]

# Parameter names that upstream also treats as "no decay", whatever module holds them.
_NO_DECAY_NAME_PATTERNS = [
    re.compile(p) for p in (r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)")
]


# --- parameter groups ---------------------------------------------------------------------------------------------


def _norm_layer_types() -> tuple[type, ...]:
    types: list[type] = [
        nn.LayerNorm,
        nn.GroupNorm,
        nn.LocalResponseNorm,
        nn.modules.batchnorm._BatchNorm,
        nn.modules.instancenorm._InstanceNorm,
    ]
    rms_norm = getattr(nn, "RMSNorm", None)  # torch >= 2.4
    if rms_norm is not None:
        types.append(rms_norm)
    return tuple(types)


def _is_norm_layer(module: nn.Module, norm_types: tuple[type, ...]) -> bool:
    return isinstance(module, norm_types) or "Norm" in type(module).__name__


def get_decay_parameter_names(model: nn.Module) -> list[str]:
    """Names (as in ``model.named_parameters()``) of the parameters that weight decay applies to.

    Excluded: every parameter inside a normalisation layer (torch's LayerNorm, GroupNorm, BatchNorm*,
    InstanceNorm*, RMSNorm, or any module whose class name contains ``"Norm"``, e.g. a model's own ``T5LayerNorm``)
    and every parameter whose lower-cased name matches upstream's no-decay patterns (``bias``, ``layernorm``,
    ``rmsnorm``, a ``norm`` path component, ``_norm``).
    """
    norm_types = _norm_layer_types()
    norm_prefixes = [name for name, module in model.named_modules() if _is_norm_layer(module, norm_types)]
    decay = []
    for name, _ in model.named_parameters():
        if any(prefix == "" or name.startswith(prefix + ".") for prefix in norm_prefixes):
            continue
        if any(pattern.search(name.lower()) for pattern in _NO_DECAY_NAME_PATTERNS):
            continue
        decay.append(name)
    return decay


def build_param_groups(model: nn.Module, weight_decay: float, *,
                       decay_names: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Upstream's two parameter groups, in its order: ``[decay, no_decay]``.

    The first holds the trainable parameters named in ``decay_names`` (default :func:`get_decay_parameter_names`)
    with ``weight_decay``, the second every other trainable parameter with ``0.0``. Only parameters with
    ``requires_grad`` are included, in ``model.named_parameters()`` order. Both groups are always returned, an empty
    one too (a LoRA model whose trainable weights all decay has ``[n, 0]``) and even when ``weight_decay`` is 0, so
    that ``optimizer.param_groups`` and ``optimizer.pt`` are exactly upstream's and checkpoints interchange.
    """
    names = set(get_decay_parameter_names(model) if decay_names is None else decay_names)
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (decay if name in names else no_decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# --- optimizer selection ------------------------------------------------------------------------------------------


def _optim_name(args: Any) -> str:
    optim = getattr(args, "optim", "adamw_torch")
    name = str(getattr(optim, "value", optim))
    if getattr(args, "adafactor", False):  # the deprecated boolean flag of older releases
        name = "adafactor"
    return name


def _adam_kwargs(args: Any) -> dict[str, Any]:
    return {"betas": (args.adam_beta1, args.adam_beta2), "eps": args.adam_epsilon}


def _fused_supported(model: nn.Module | None) -> bool:
    if model is None:
        return True
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # private helper moved: let torch decide when the optimizer is built
        return True
    trainable = [p for p in model.parameters() if p.requires_grad]
    return all(p.device.type in devices and p.is_floating_point() for p in trainable)


def _sharded_fp16(args: Any, model: nn.Module | None) -> bool:
    """fp16 over FSDP-sharded (``DTensor``) parameters: the loss is scaled by a ``ShardedGradScaler``, whose
    ``found_inf`` has shape ``(1,)``, and torch's fused AdamW cannot subtract that from its 0-dim step counters
    ("output with shape [] doesn't match the broadcast shape [1]", on every device; pytorch/pytorch#140514)."""
    if model is None or not getattr(args, "fp16", False):
        return False
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in model.parameters() if p.requires_grad)


def _adamw_fused(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    kwargs = _adam_kwargs(args)
    if _sharded_fp16(args, model):
        warnings.warn(
            "fp16 with FSDP scales the loss with a ShardedGradScaler, which torch's fused AdamW cannot step with "
            "(pytorch/pytorch#140514): using the non-fused torch AdamW (set optim='adamw_torch' to silence this, "
            "or use bf16).",
            stacklevel=3,
        )
    elif _fused_supported(model):
        kwargs["fused"] = True
    else:
        warnings.warn(
            "optim='adamw_torch_fused' is not supported for this model's parameter devices/dtypes; "
            "falling back to the non-fused torch AdamW (set optim='adamw_torch' to silence this).",
            stacklevel=3,
        )
    return torch.optim.AdamW, kwargs


def _adamw_hf(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    warnings.warn(
        "optim='adamw_hf' (the transformers AdamW) is deprecated; trainwell uses torch.optim.AdamW instead. "
        "Set optim='adamw_torch' to silence this warning.",
        FutureWarning,
        stacklevel=3,
    )
    return torch.optim.AdamW, _adam_kwargs(args)


def _apex_fused(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    try:
        from apex.optimizers import FusedAdam
    except ImportError as error:
        raise ImportError(
            "optim='adamw_apex_fused' needs NVIDIA apex (package `apex`); install it from "
            "https://github.com/NVIDIA/apex or use optim='adamw_torch_fused'."
        ) from error
    return FusedAdam, _adam_kwargs(args)


def _bnb_8bit(args: Any, model: nn.Module | None) -> tuple[type, dict[str, Any]]:
    try:
        from bitsandbytes.optim import AdamW as BnbAdamW
    except ImportError as error:
        raise ImportError(
            "optim='adamw_bnb_8bit' needs the `bitsandbytes` package; run `pip install bitsandbytes` "
            "or use optim='adamw_torch'."
        ) from error
    return BnbAdamW, {**_adam_kwargs(args), "optim_bits": 8}


_FACTORIES: dict[str, Callable[[Any, nn.Module | None], tuple[type, dict[str, Any]]]] = {
    "adamw_torch": lambda args, model: (torch.optim.AdamW, _adam_kwargs(args)),
    "adamw_torch_fused": _adamw_fused,
    "adamw_hf": _adamw_hf,
    "adafactor": lambda args, model: (Adafactor, {"scale_parameter": False, "relative_step": False}),
    "sgd": lambda args, model: (torch.optim.SGD, {"momentum": 0.0}),
    "adagrad": lambda args, model: (torch.optim.Adagrad, {}),
    "rmsprop": lambda args, model: (torch.optim.RMSprop, {}),
    "adamw_apex_fused": _apex_fused,
    "adamw_bnb_8bit": _bnb_8bit,
}


def _check_kwargs(optimizer_cls: type, kwargs: dict[str, Any], name: str) -> None:
    try:
        parameters = inspect.signature(getattr(optimizer_cls, "__init__")).parameters  # the constructor's arguments
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = [key for key in parameters if key not in ("self", "params")]
    unknown = [key for key in kwargs if key not in accepted]
    if unknown:
        raise ValueError(
            f"optim_args {unknown} are not accepted by {optimizer_cls.__name__} (optim={name!r}); "
            f"accepted keys: {accepted}."
        )


def get_optimizer_cls_and_kwargs(args: Any, model: nn.Module | None = None) -> tuple[type, dict[str, Any]]:
    """The optimizer class and its keyword arguments (all but the parameters) for ``args.optim``.

    ``lr`` is ``args.learning_rate``; the AdamW variants take ``betas=(adam_beta1, adam_beta2)`` and
    ``eps=adam_epsilon``; Adafactor runs with ``scale_parameter=False, relative_step=False`` (so with that
    ``lr``); ``args.optim_args`` (``"key=value,..."``) is merged last and overrides. ``model`` is used to check
    that the fused AdamW kernels support its parameters. Raises ``ValueError`` for an unknown name or an
    ``optim_args`` key the optimizer does not take, ``ImportError`` when apex / bitsandbytes is missing.
    """
    name = _optim_name(args)
    factory = _FACTORIES.get(name) or EXTRA_FACTORIES.get(name)
    if factory is None:
        raise ValueError(
            f"unknown optim={name!r}; trainwell supports {list(SUPPORTED_OPTIMIZERS)}. "
            "Set `optim` in TrainingArguments to one of them."
        )
    optimizer_cls, kwargs = factory(args, model)
    consumed = kwargs.pop("_consumed_optim_args", ())  # optim_args a factory already put in its param groups
    extra = {k: v for k, v in parse_optim_args(getattr(args, "optim_args", None)).items() if k not in consumed}
    kwargs = {"lr": args.learning_rate, **kwargs, **extra}
    _check_kwargs(optimizer_cls, {k: v for k, v in kwargs.items() if k != "params"}, name)
    return optimizer_cls, kwargs


def is_optimizer_factory(optimizer_cls: Any) -> bool:
    """Whether ``optimizer_cls`` (from ``get_optimizer_cls_and_kwargs``) is a factory, not a ``torch.optim.Optimizer``
    class: it is instantiated without arguments and called with ``(model, **kwargs)`` (upstream's Muon/Dion pattern)."""
    return not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer))


def _params_from_kwargs(kwargs: dict[str, Any], groups: Any) -> Any:
    """What the optimizer is built over: ``groups``, unless the kwargs bring their own under ``params`` (GaLore),
    ``model`` (LOMO) or ``optimizer_dict`` (layer-wise optimizers; sentence-transformers' ``learning_rate_mapping``),
    popped from ``kwargs`` as upstream does (the last one present wins)."""
    for key in ("params", "model", "optimizer_dict"):
        if key in kwargs:
            groups = kwargs.pop(key)
    return groups


def _has_trainable(params: Any) -> bool:
    if isinstance(params, nn.Module):
        return any(p.requires_grad for p in params.parameters())
    if isinstance(params, dict):
        return True  # a layer-wise {param: optimizer} mapping
    items = list(params)
    return any(bool(item.get("params")) if isinstance(item, dict) else True for item in items)


def instantiate_optimizer(optimizer_cls: Any, optimizer_kwargs: dict[str, Any], groups: Any,
                          model: nn.Module) -> Optimizer:
    """``optimizer_cls(groups, **optimizer_kwargs)``, as upstream's ``Trainer.create_optimizer`` builds it from the
    result of ``get_optimizer_cls_and_kwargs``: a factory is called as ``optimizer_cls()(model, **kwargs)``; a
    ``params``/``model``/``optimizer_dict`` entry of the kwargs replaces ``groups``. ``optimizer_kwargs`` itself is
    not changed.

    Raises ``ValueError`` when nothing to optimize has ``requires_grad``. A fused AdamW that torch refuses for these
    parameters falls back to the non-fused one with a warning.
    """
    kwargs = dict(optimizer_kwargs)
    if is_optimizer_factory(optimizer_cls):
        return optimizer_cls()(model, **kwargs)
    params = _params_from_kwargs(kwargs, groups)
    if not _has_trainable(params):
        raise ValueError(
            f"the model {type(model).__name__} has no parameter with requires_grad=True, so there is nothing to "
            "optimize; unfreeze some parameters (param.requires_grad_(True)) before training."
        )
    try:
        return optimizer_cls(params, **kwargs)
    except RuntimeError as error:
        if not kwargs.get("fused"):
            raise
        warnings.warn(
            f"fused AdamW is not available here ({error}); falling back to the non-fused torch AdamW.",
            stacklevel=2,
        )
        kwargs.pop("fused")
        return optimizer_cls(params, **kwargs)


def create_optimizer(model: nn.Module, args: Any) -> Optimizer:
    """The optimizer of ``args.optim`` over ``build_param_groups(model, args.weight_decay)`` (upstream's two groups,
    an empty one kept), from :func:`get_optimizer_cls_and_kwargs` and :func:`instantiate_optimizer`; what
    ``Trainer.create_optimizer`` builds by default."""
    optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(args, model)
    return instantiate_optimizer(optimizer_cls, kwargs, build_param_groups(model, args.weight_decay), model)


# --- Adafactor ----------------------------------------------------------------------------------------------------


def _rms(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.norm(2) / (tensor.numel() ** 0.5)


class Adafactor(torch.optim.Optimizer):
    """Adafactor (Shazeer & Stern, 2018, https://arxiv.org/abs/1804.04235) with upstream's arguments.

    The second moment of a 2D+ parameter is kept factored as row and column averages (memory ``O(n + m)``
    instead of ``O(n * m)``); 0D/1D parameters keep a full second moment. Arguments:

    - ``lr``: external learning rate; must be ``None`` when ``relative_step=True``.
    - ``eps``: ``(eps1, eps2)``: regulariser added to the squared gradient, and the floor of the parameter scale.
    - ``clip_threshold``: the update's RMS is clipped to this value.
    - ``decay_rate``: the second-moment decay is ``1 - step ** decay_rate``.
    - ``beta1``: first-moment coefficient; ``None`` keeps no first moment (the memory-saving default).
    - ``weight_decay``: decoupled weight decay, scaled by the step size.
    - ``scale_parameter``: multiply the step size by the parameter's RMS.
    - ``relative_step``: use the time-dependent step size ``min(1e-2, 1/sqrt(step))`` instead of ``lr``.
    - ``warmup_init``: with ``relative_step``, start from ``1e-6 * step`` instead of ``1e-2``.

    The Trainer uses ``Adafactor(params, lr=args.learning_rate, scale_parameter=False, relative_step=False)``.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float | None = None,
        eps: tuple[float, float] = (1e-30, 1e-3),
        clip_threshold: float = 1.0,
        decay_rate: float = -0.8,
        beta1: float | None = None,
        weight_decay: float = 0.0,
        scale_parameter: bool = True,
        relative_step: bool = True,
        warmup_init: bool = False,
    ) -> None:
        if lr is not None and relative_step:
            raise ValueError("Adafactor: cannot combine a manual `lr` with `relative_step=True`; drop one of them.")
        if warmup_init and not relative_step:
            raise ValueError("Adafactor: `warmup_init=True` needs `relative_step=True`.")
        defaults = {
            "lr": lr,
            "eps": tuple(eps),
            "clip_threshold": clip_threshold,
            "decay_rate": decay_rate,
            "beta1": beta1,
            "weight_decay": weight_decay,
            "scale_parameter": scale_parameter,
            "relative_step": relative_step,
            "warmup_init": warmup_init,
        }
        super().__init__(params, defaults)

    @staticmethod
    def _get_lr(param_group: dict[str, Any], param_state: dict[str, Any]) -> float:
        """The step size of ``param_group`` for a parameter whose state is ``param_state`` (upstream's name: read
        by :class:`~trainwell.optim.adafactor_schedule.AdafactorSchedule` and by code logging Adafactor's rate)."""
        group, state = param_group, param_state
        step_size = group["lr"]
        if group["relative_step"]:
            min_step = 1e-6 * state["step"] if group["warmup_init"] else 1e-2
            step_size = min(min_step, 1.0 / math.sqrt(state["step"]))
        scale = max(group["eps"][1], state["RMS"]) if group["scale_parameter"] else 1.0
        return scale * step_size

    @staticmethod
    def _get_options(param_group: dict[str, Any], param_shape: tuple[int, ...]) -> tuple[bool, bool]:
        """``(factored, use_first_moment)``: a 2D+ parameter keeps a factored second moment; ``beta1`` a first."""
        return len(param_shape) >= 2, param_group["beta1"] is not None

    @staticmethod
    def _rms(tensor: torch.Tensor) -> torch.Tensor:
        """Root mean square of ``tensor``."""
        return _rms(tensor)

    @staticmethod
    def _init_state(state: dict[str, Any], grad: torch.Tensor, group: dict[str, Any]) -> None:
        state["step"] = 0
        state["RMS"] = 0.0
        if group["beta1"] is not None:
            state["exp_avg"] = torch.zeros_like(grad)
        if grad.dim() >= 2:
            state["exp_avg_sq_row"] = grad.new_zeros(grad.shape[:-1])
            state["exp_avg_sq_col"] = grad.new_zeros(grad.shape[:-2] + grad.shape[-1:])
        else:
            state["exp_avg_sq"] = torch.zeros_like(grad)

    @staticmethod
    def _preconditioned(grad: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor:
        """``grad / sqrt(v)`` where ``v`` is the (factored) running mean of ``grad ** 2 + eps1``."""
        beta2t = 1.0 - math.pow(state["step"], group["decay_rate"])
        squared = grad.square() + group["eps"][0]
        if grad.dim() < 2:
            exp_avg_sq = state["exp_avg_sq"]
            exp_avg_sq.mul_(beta2t).add_(squared, alpha=1.0 - beta2t)
            return exp_avg_sq.rsqrt().mul_(grad)
        row, col = state["exp_avg_sq_row"], state["exp_avg_sq_col"]
        row.mul_(beta2t).add_(squared.mean(dim=-1), alpha=1.0 - beta2t)
        col.mul_(beta2t).add_(squared.mean(dim=-2), alpha=1.0 - beta2t)
        # v ~= row (x) col / mean(row): the rank-1 reconstruction of the paper
        row_factor = (row / row.mean(dim=-1, keepdim=True)).rsqrt().unsqueeze(-1)
        col_factor = col.unsqueeze(-2).rsqrt()
        return (row_factor * col_factor).mul_(grad)

    def _update_param(self, param: torch.Tensor, group: dict[str, Any]) -> None:
        grad = param.grad
        assert grad is not None  # step() updates only the parameters that have a gradient
        if grad.is_sparse:
            raise RuntimeError("Adafactor does not support sparse gradients; use dense embeddings (sparse=False).")
        grad = grad.float()  # statistics in float32 even for fp16/bf16 parameters
        state = self.state[param]
        if not state:
            self._init_state(state, grad, group)
        value = param.float() if param.dtype in (torch.float16, torch.bfloat16) else param
        state["step"] += 1
        state["RMS"] = float(_rms(value))
        step_size = self._get_lr(group, state)
        update = self._preconditioned(grad, state, group)
        update.div_((_rms(update) / group["clip_threshold"]).clamp_(min=1.0)).mul_(step_size)
        if group["beta1"] is not None:
            state["exp_avg"].mul_(group["beta1"]).add_(update, alpha=1.0 - group["beta1"])
            update = state["exp_avg"]
        if group["weight_decay"] != 0:
            value.add_(value, alpha=-group["weight_decay"] * step_size)
        value.add_(-update)
        if value is not param:
            param.copy_(value)

    # torch declares step() as two overloads (no closure -> None, a closure -> float); one signature serves both
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Perform one optimisation step; ``closure`` re-evaluates the model and returns the loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    self._update_param(param, group)
        return loss
