"""What lives for one ``train()`` call only: the underflow/overflow detector, NEFTune embedding noise, Liger kernels
and the ``torch_empty_cache_steps`` callback.

``attach(args, model, callbacks)`` registers what the arguments ask for (nothing at all when they ask for nothing,
so the default run pays no hook) and returns them as :class:`TrainHooks`, whose ``detach()`` the run calls when
training ends, after an error too.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..args.fields import DebugOption
from ..callbacks.base import TrainerCallback
from ..utils.model_utils import unwrap_model
from .nested import upcast_half
from .underflow_overflow import DebugUnderflowOverflow

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
    from ..callbacks.events import CallbackHandler
    from ..utils.trainer_state import TrainerControl, TrainerState


def clear_device_cache(device: torch.device) -> None:
    """Give the cached blocks of ``device``'s allocator back (CUDA, MPS, XPU; nothing to do on the CPU)."""
    backend = getattr(torch, device.type, None)
    if device.type != "cpu" and backend is not None and hasattr(backend, "empty_cache"):
        backend.empty_cache()


class EmptyCacheCallback(TrainerCallback):
    """``torch_empty_cache_steps``: empty the device cache after every ``every`` optimizer steps."""

    def __init__(self, every: int, device: torch.device) -> None:
        self.every, self.device, self.calls = every, device, 0

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        if state.global_step % self.every == 0:
            clear_device_cache(self.device)
            self.calls += 1


def neftune_post_forward_hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
    """NEFTune: uniform noise of magnitude ``alpha / sqrt(seq_len * hidden)`` on the embeddings, in training only."""
    if module.training:
        # float32 arithmetic, as upstream's hook, so the same generator state gives the same noise bit for bit
        alpha: float = getattr(module, "neftune_noise_alpha")
        mag_norm = cast(float, alpha / torch.sqrt(torch.tensor(output.size(1) * output.size(2))))  # a 0-d tensor
        output = output + torch.zeros_like(output).uniform_(-mag_norm, mag_norm)
    return output


def _input_embeddings(model: nn.Module) -> nn.Module:
    inner = unwrap_model(model)
    base = getattr(getattr(inner, "base_model", None), "model", None)  # a PEFT model wraps the transformer
    owner = base if base is not None and hasattr(base, "get_input_embeddings") else inner
    get = getattr(owner, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    if not isinstance(embeddings, nn.Module):
        raise ValueError(
            f"neftune_noise_alpha needs a model whose get_input_embeddings() returns its embedding module; "
            f"{type(inner).__name__} has none. Add a get_input_embeddings() method or leave neftune_noise_alpha unset."
        )
    return embeddings


def float32_outputs_hook(module: nn.Module, inputs: Any, output: Any) -> Any:
    """The model's outputs with their float16/bfloat16 tensors as float32 (see :func:`upcasts_outputs`)."""
    return upcast_half(output)


class _ForwardPrecision:
    """The two hooks of :func:`forward_precision`: autocast entered before the forward, left after it (an exception
    too), and the outputs upcast to float32."""

    def __init__(self, autocast: Callable[[], AbstractContextManager[Any]]) -> None:
        self.autocast = autocast
        self.open: list[AbstractContextManager[Any]] = []  # a stack: a forward may run inside another (generate)

    def enter(self, module: nn.Module, inputs: Any) -> None:
        context = self.autocast()
        context.__enter__()
        self.open.append(context)

    def leave(self, module: nn.Module, inputs: Any, output: Any) -> Any:
        if self.open:
            self.open.pop().__exit__(None, None, None)
        return upcast_half(output)


class _Unhook:
    """Removes the hooks of one :func:`forward_precision` and frees the module for another."""

    def __init__(self, module: nn.Module, handles: list[Any]) -> None:
        self.module, self.handles = module, handles

    def remove(self) -> None:
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()
        if handles:
            _PRECISION_HOOKED.discard(self.module)


#: the modules whose forward runs under forward_precision's hooks now (one pair of hooks per module)
_PRECISION_HOOKED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def forward_precision(model: nn.Module, autocast: Callable[[], AbstractContextManager[Any]]) -> Any:
    """Run ``model``'s forward in ``autocast()`` and upcast its half-precision outputs to float32, wherever it is
    called from; returns a handle whose ``remove()`` undoes it (a no-op handle when ``model`` is hooked already).

    Upstream rule: under fp16/bf16, accelerate's ``prepare_model`` replaces the model's forward by one that runs in
    autocast and returns float32 outputs (``convert_outputs_to_fp32``), so every call of the prepared model is mixed
    precision, not only the ones the Trainer makes: a library's own ``prediction_step`` (TRL's ORPO, CPO, TPO) or
    the generation inside its ``training_step`` (GKD, OnlineDPO) too. The Trainer's own steps keep their autocast
    context (around the loss as well); these hooks add it where a library calls the model outside them."""
    if model in _PRECISION_HOOKED:
        return _Unhook(model, [])
    hooks = _ForwardPrecision(autocast)
    handles = [model.register_forward_pre_hook(hooks.enter),
               model.register_forward_hook(hooks.leave, always_call=True)]
    _PRECISION_HOOKED.add(model)
    return _Unhook(model, handles)


def upcasts_outputs(args: TrainingArguments) -> bool:
    """Whether the model's outputs are upcast to float32: under fp16/bf16 autocast, not DeepSpeed's own precision.

    Upstream rule: accelerate's ``Accelerator.prepare_model`` wraps the forward of a model prepared under native AMP
    in ``convert_outputs_to_fp32`` (accelerate/utils/operations.py), so ``compute_loss_func``, the label smoother and
    the outputs ``compute_loss`` returns see float32 logits although the forward ran in autocast."""
    return bool(getattr(args, "fp16", False) or getattr(args, "bf16", False)) and not getattr(args, "deepspeed", None)


class TrainHooks:
    """What :func:`attach` registered for one run; :meth:`detach` takes it all off again (idempotent)."""

    def __init__(self, callbacks: CallbackHandler) -> None:
        self.callbacks = callbacks
        self.handles: list[Any] = []  # torch hook handles (float32 outputs, NEFTune)
        self.neftune_embeddings: nn.Module | None = None
        self.empty_cache_callback: EmptyCacheCallback | None = None
        self.overflow_detector: Any = None  # DebugUnderflowOverflow

    def detach(self) -> None:
        """Remove every hook, attribute and callback :func:`attach` added (a no-op the second time)."""
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()
        embeddings, self.neftune_embeddings = self.neftune_embeddings, None
        if embeddings is not None and hasattr(embeddings, "neftune_noise_alpha"):
            del embeddings.neftune_noise_alpha
        callback, self.empty_cache_callback = self.empty_cache_callback, None
        if callback is not None:
            self.callbacks.remove_callback(callback)
        detector, self.overflow_detector = self.overflow_detector, None
        if detector is not None:
            detector.remove()


def attach(args: TrainingArguments, model: nn.Module, callbacks: CallbackHandler,
           autocast: Callable[[], AbstractContextManager[Any]] | None = None) -> TrainHooks:
    """Register the hooks ``args`` asks for on ``model`` (and the ``torch_empty_cache_steps`` callback);
    ``autocast``: the backend's mixed-precision context, for :func:`forward_precision`."""
    hooks = TrainHooks(callbacks)
    try:
        if upcasts_outputs(args) and autocast is not None:  # the forward as accelerate prepares it
            hooks.handles.append(forward_precision(unwrap_model(model), autocast))
        elif upcasts_outputs(args):  # float32 outputs under autocast, as accelerate's convert_outputs_to_fp32
            hooks.handles.append(model.register_forward_hook(float32_outputs_hook))
        if args.neftune_noise_alpha is not None:
            embeddings = _input_embeddings(model)
            setattr(embeddings, "neftune_noise_alpha", args.neftune_noise_alpha)  # read by the hook
            hooks.handles.append(embeddings.register_forward_hook(neftune_post_forward_hook))
            hooks.neftune_embeddings = embeddings
        if DebugOption.UNDERFLOW_OVERFLOW in args.debug:
            if args.n_gpu > 1:
                raise ValueError("debug='underflow_overflow' is not supported with several GPUs in one process "
                                 "(DataParallel); launch one process per GPU with torchrun.")

            hooks.overflow_detector = DebugUnderflowOverflow(unwrap_model(model))
        if args.use_liger_kernel:  # args refused it when the package is missing
            from liger_kernel.transformers import _apply_liger_kernel_to_instance

            config = args.liger_kernel_config if isinstance(args.liger_kernel_config, dict) else {}  # parsed by args
            _apply_liger_kernel_to_instance(model=unwrap_model(model), **config)
        if args.torch_empty_cache_steps is not None:
            callback = EmptyCacheCallback(args.torch_empty_cache_steps, args.device)
            callbacks.add_callback(callback)
            hooks.empty_cache_callback = callback
    except BaseException:
        hooks.detach()
        raise
    return hooks
