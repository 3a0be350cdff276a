"""Model helpers: signatures, parameter counts, gradient checkpointing for plain modules, compilation, unwrapping."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Mapping
from typing import Any, Callable, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside DataParallel / DDP / torch.compile wrappers."""
    while True:
        if hasattr(model, "_orig_mod"):
            model = cast(nn.Module, model._orig_mod)  # torch.compile's OptimizedModule
        elif isinstance(model, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            model = model.module
        else:
            return model


def unwrap_for_signature(model: Any) -> Any:
    """The module whose ``forward`` defines the accepted inputs: unwraps DDP/DataParallel (``.module``),
    ``torch.compile`` (``_orig_mod``) and PEFT models (``get_base_model()``)."""
    seen: set[int] = set()
    while id(model) not in seen:
        seen.add(id(model))
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
        elif hasattr(model, "module") and hasattr(model.module, "forward"):
            model = model.module
    return model


def forward_parameters(model: nn.Module) -> dict[str, inspect.Parameter]:
    """The parameters of ``unwrap_model(model).forward``."""
    return dict(inspect.signature(unwrap_model(model).forward).parameters)


def find_labels(model: nn.Module | type[nn.Module]) -> list[str]:
    """The label arguments of a model's ``forward``, by upstream's rule (``transformers.utils.find_labels``).

    Every parameter whose name contains ``"label"``, plus ``start_positions``/``end_positions`` for a
    question-answering model (a class name containing ``QuestionAnswering``).
    """
    cls = model if isinstance(model, type) else type(unwrap_model(model))
    params = inspect.signature(cls.forward).parameters
    qa = "QuestionAnswering" in cls.__name__
    return [p for p in params if "label" in p or (qa and p in ("start_positions", "end_positions"))]


def default_label_names(model: nn.Module) -> list[str]:
    """``label_names`` when ``TrainingArguments.label_names`` is unset: upstream's ``find_labels`` on the model
    (a PEFT model: its base model), so ``forward(input)`` has none; trainwell's one difference is a forward taking
    nothing but ``*args``/``**kwargs`` (a generic wrapper), which gets ``["labels"]`` so its eval loss is computed.
    """
    inner = unwrap_for_signature(model)
    found = find_labels(inner)
    if found:
        return found
    params = inspect.signature(type(inner).forward).parameters.values()
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
    generic = not named and any(p.kind == p.VAR_KEYWORD for p in params)
    return ["labels"] if generic else []


def accepts_loss_kwargs(model: nn.Module) -> bool:
    """Whether ``num_items_in_batch`` can be passed to the model's forward (upstream's rule): the model's
    ``accepts_loss_kwargs`` attribute when it declares one, else a parameter of that name or ``**kwargs``.

    Whether the loss then honours it is another question, answered at train time (``loops.loss_scaling``).
    """
    inner = unwrap_model(model)
    declared = getattr(inner, "accepts_loss_kwargs", None)
    if declared is not None:
        return bool(declared)
    params = forward_parameters(inner)
    return "num_items_in_batch" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def is_causal_lm(model: nn.Module) -> bool:
    """Whether ``model`` (a PEFT wrapper: its base model) is one of transformers' causal LMs, by class name as
    upstream decides (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``): its logits at position t predict label t + 1. The
    mapping is read only once transformers is imported (a transformers model imports it); this never imports it."""
    import sys

    if "transformers" not in sys.modules:
        return False
    model = unwrap_model(model)
    base = getattr(getattr(model, "base_model", None), "model", None)
    if base is not None and any(cls.__name__.startswith("Peft") for cls in type(model).__mro__):
        model = base
    return type(model).__name__ in _causal_lm_names()


@functools.lru_cache(maxsize=1)
def _causal_lm_names() -> frozenset[str]:
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return frozenset()
    return frozenset(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())


def count_parameters(model: nn.Module, *, trainable_only: bool = False) -> int:
    """Number of (trainable) parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def _checkpointed_forward(forward: Any, kwargs: dict[str, Any], module: nn.Module, *args: Any, **fkwargs: Any) -> Any:
    if module.training and torch.is_grad_enabled():
        if kwargs.get("_offload"):  # activation_checkpointing_kwargs['offload']: the saved inputs on the host
            options = {key: value for key, value in kwargs.items() if key != "_offload"}
            with torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available()):
                return checkpoint(forward, *args, **options, **fkwargs)
        return checkpoint(forward, *args, **kwargs, **fkwargs)
    return forward(*args, **fkwargs)


def activation_checkpointing(args: Any) -> tuple[bool, dict[str, Any] | None]:
    """``(activation_checkpointing, its kwargs)`` of the arguments: upstream 5.24's names, or their deprecated
    ``gradient_checkpointing*`` aliases on an arguments object that has only those (a namespace, an older copy)."""
    on = getattr(args, "activation_checkpointing", None)
    kwargs = getattr(args, "activation_checkpointing_kwargs", None)
    if on is None:
        on, kwargs = getattr(args, "gradient_checkpointing", False), getattr(args, "gradient_checkpointing_kwargs", None)
    return bool(on), kwargs


def enable_gradient_checkpointing(model: nn.Module, kwargs: dict[str, Any] | None = None) -> int:
    """Turn on activation checkpointing; returns the number of wrapped blocks (0 when the model does it itself).

    As upstream 5.24's Trainer, ``every_n_layers`` (checkpoint every n-th layer only) and ``offload`` (saved
    activations in pinned host memory) come out of ``kwargs`` and the rest goes to ``torch.utils.checkpoint``. A
    transformers model is asked to do it: ``activation_checkpointing_enable`` (transformers >= 5.2x, where
    ``gradient_checkpointing_enable`` is a deprecated alias) or ``gradient_checkpointing_enable``. For a plain
    module every ``every_n_layers``-th block of every ``nn.ModuleList`` (the usual stack of layers) recomputes its
    activations in backward (``offload`` keeps them on the host with ``torch.autograd.graph.save_on_cpu``).
    """
    kwargs = dict(kwargs or {})
    every_n_layers, offload = int(kwargs.pop("every_n_layers", 1)), bool(kwargs.pop("offload", False))
    if every_n_layers < 1:
        raise ValueError(f"activation_checkpointing_kwargs['every_n_layers']={every_n_layers}: use 1 (every layer) "
                         "or more (every n-th layer)")
    # transformers' methods, which nn.Module does not declare
    if hasattr(model, "activation_checkpointing_enable"):
        getattr(model, "activation_checkpointing_enable")(activation_checkpointing_kwargs=kwargs or None,
                                                          every_n_layers=every_n_layers, offload=offload)
        return 0
    if hasattr(model, "gradient_checkpointing_enable"):
        extra = {} if every_n_layers == 1 and not offload else {"every_n_layers": every_n_layers, "offload": offload}
        getattr(model, "gradient_checkpointing_enable")(gradient_checkpointing_kwargs=kwargs or None, **extra)
        return 0
    kwargs.setdefault("use_reentrant", False)
    if offload:
        kwargs["_offload"] = True
    wrapped = 0
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for index, block in enumerate(module):
                if index % every_n_layers == 0 and not getattr(block, "_trainwell_checkpointed", False):
                    block.forward = functools.partial(_checkpointed_forward, block.forward, kwargs, block)
                    setattr(block, "_trainwell_checkpointed", True)  # nn.Module types attributes Tensor | Module
                    wrapped += 1
    if wrapped == 0:
        raise ValueError(
            f"activation_checkpointing=True (or gradient_checkpointing=True), but {type(model).__name__} has neither "
            "activation_checkpointing_enable() nor an nn.ModuleList of blocks to checkpoint; remove the flag or wrap "
            "your layers in an nn.ModuleList"
        )
    return wrapped


def compile_model(model: nn.Module, args: Any, *, in_engine: bool = False) -> nn.Module:
    """``torch.compile`` with the ``torch_compile_backend`` / ``torch_compile_mode`` arguments.

    ``in_engine`` (a backend whose ``caps.compiles_in_engine``, DeepSpeed): the engine compiles its own module,
    ``model.compile(backend=..., compile_kwargs=...)``, and stays the object returned, as accelerate's
    ``Accelerator._prepare_deepspeed`` calls ``engine.compile``; ``torch.compile`` on the engine would hide its
    ``backward``/``step`` behind an ``OptimizedModule``."""
    kwargs: dict[str, Any] = {"backend": getattr(args, "torch_compile_backend", None) or "inductor"}
    if getattr(args, "torch_compile_mode", None):
        kwargs["mode"] = args.torch_compile_mode
    if in_engine:
        backend = kwargs.pop("backend")
        model.compile(backend=backend, compile_kwargs=kwargs)
        return model
    return cast(nn.Module, torch.compile(model, **kwargs))  # an OptimizedModule (typed as a plain callable)


def flops_rule(model: Any) -> Callable[[Any], int]:
    """How ``Trainer.floating_point_ops`` counts for ``model``, decided once per model: the model's own
    ``floating_point_ops``, else 6 x its non-embedding parameters x the elements of its main input (transformers
    models), else 6 x its parameters x the items of the batch's first tensor."""
    own = getattr(model, "floating_point_ops", None)
    if own is not None:
        return own
    counter = getattr(model, "num_parameters", None)
    if callable(counter):  # transformers 5 models have no floating_point_ops; upstream counts these parameters
        return functools.partial(_flops_by_main_input, getattr(model, "main_input_name", "input_ids"),
                       6 * counter(exclude_embeddings=True))
    return functools.partial(_flops_by_first_tensor, 6 * count_parameters(unwrap_model(model)))


def _flops_by_main_input(main_input: str, six_params: int, inputs: Any) -> int:
    if isinstance(inputs, Mapping) and main_input in inputs:
        return six_params * inputs[main_input].numel()
    return _flops_by_first_tensor(six_params, inputs)


def _flops_by_first_tensor(six_params: int, inputs: Any) -> int:
    """6 x parameters (``six_params``) x the tokens of ``input_ids``, else of the batch's first tensor (one item per
    row for features)."""
    if type(inputs) is dict or isinstance(inputs, Mapping):  # dict first: the ABC check is slow
        main = inputs.get("input_ids")
        if main is None:
            for main in inputs.values():  # the first tensor
                if isinstance(main, torch.Tensor):
                    break
            else:
                return 0
        if main.is_floating_point():  # features, not tokens: one item per row
            return six_params * (main.shape[0] if main.dim() else 1)
        return six_params * main.numel()
    return 0
