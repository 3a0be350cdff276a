"""One process: a single device (CPU, one CUDA GPU, MPS), or ``nn.DataParallel`` over the GPUs of one process."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..runtime.precision import Precision
from .base import Capabilities, prepared
from .placement import is_model_parallel, places_itself
from ..checkpoint.layout import OPTIMIZER_NAME
from .optimizer_state_forms import FSDP_STATE_DIR, load_dcp_unsharded

_NULL = nullcontext()


class SingleDeviceBackend:
    """Backward, clipping and stepping for a model that lives in this process.

    Precision is fixed when the backend is built: autocast comes from :class:`Precision`, and every step goes
    through its gradient scaler, which is created disabled unless fp16 is on (then ``scale`` returns the loss,
    ``unscale_`` and ``update`` do nothing and ``step`` steps the optimizer), so these methods are one straight line
    whatever the precision. Subclasses (DDP) change only the wrapping and ``no_sync``.
    """

    caps = Capabilities(async_checkpoint=True)
    input_dtype: torch.dtype | None = None  # inputs keep their dtype (autocast handles mixed precision)
    engine: Any = None  # no engine object
    ds_config: Any = None  # not DeepSpeed

    def __init__(self, device: torch.device, precision: Precision, *, n_gpu: int = 1,
                 place_model_on_device: bool = True) -> None:
        self.device = device
        self.precision = precision
        self.scaler = precision.scaler  # created disabled unless fp16: then each of its calls passes through
        self.n_gpu = n_gpu
        self.place_model_on_device = place_model_on_device
        self.model: nn.Module | None = None
        self.wrapped: nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: Any = None
        self.num_training_steps: int | None = None

    # -- model -------------------------------------------------------------------------------------------------
    def model_init_context(self) -> AbstractContextManager[Any]:
        """Models are built as usual."""
        return _NULL

    def prepare_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Move ``model`` to the device; wrap it in ``DataParallel`` when this process drives several GPUs.

        A model that places itself (a ``device_map`` over several devices, bitsandbytes weights) is neither moved nor
        wrapped: upstream forces ``n_gpu = 1`` for model parallelism and skips ``.to()`` for both."""
        if self.place_model_on_device and not places_itself(model, self.device):
            model = model.to(self.device)
        self.model = model
        data_parallel = self.n_gpu > 1 and training and not is_model_parallel(model, self.device)
        self.wrapped = nn.DataParallel(model) if data_parallel else model
        return self.wrapped

    def setup_optimization(self, optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> None:
        """Adopt the optimizer and scheduler built by the trainer."""
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler

    # -- the step ----------------------------------------------------------------------------------------------
    def autocast(self) -> AbstractContextManager[Any]:
        """The forward-pass precision context."""
        return self.precision.autocast()

    def no_sync(self, sync: bool) -> AbstractContextManager[Any]:
        """Nothing to synchronise in one process."""
        return _NULL

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate the loss, scaled when fp16 is on (a disabled scaler returns it as it is)."""
        self.scaler.scale(loss).backward()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor | None:
        """Unscale (fp16; a disabled scaler does nothing) then clip all gradients to ``max_norm``; returns the norm
        before clipping."""
        self.scaler.unscale_(prepared(self.optimizer, "optimizer"))
        return torch.nn.utils.clip_grad_norm_(prepared(self.model, "model").parameters(), max_norm)

    def last_grad_norm(self) -> torch.Tensor | None:
        """None: the loop measures the norm itself through :meth:`clip_grad_norm`."""
        return None

    def optimizer_step(self) -> bool:
        """Step through the scaler: with fp16 a step whose gradients overflowed is skipped, the scale drops and False
        is returned; a disabled scaler steps the optimizer (its scale stays 1.0)."""
        scale_before = self.scaler.get_scale()
        self.scaler.step(prepared(self.optimizer, "optimizer"))
        self.scaler.update()
        return self.scaler.get_scale() >= scale_before

    def zero_grad(self) -> None:
        """Drop the gradients (set to None: cheaper than zeroing)."""
        prepared(self.optimizer, "optimizer").zero_grad(set_to_none=True)

    # -- state -------------------------------------------------------------------------------------------------
    def state_dicts(self) -> Mapping[str, Any]:
        """The grad scaler, when fp16 is on."""
        return {"scaler": self.scaler} if self.scaler.is_enabled() else {}

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The model's own state dict (nothing to gather in one process); None before training prepared the model."""
        return None if self.model is None else self.model.state_dict()

    def stream_state_dict(self, *, model_save: bool) -> Any:
        """None: the model's own state dict is complete (see :meth:`Backend.stream_state_dict`)."""
        return None

    def gathered_parameters(self) -> AbstractContextManager[Any]:
        """The parameters are whole in this process: nothing to gather."""
        return _NULL

    def check_checkpoint(self, folder: Path) -> None:
        """Nothing beyond trainwell's own files to check."""

    def save(self, folder: Path) -> None:
        """Nothing beyond the common checkpoint files."""

    def async_engine_snapshot(self) -> Callable[[Path, Any], None] | None:
        """None: nothing beyond the common checkpoint files (see :meth:`Backend.async_engine_snapshot`)."""
        return None

    def load(self, folder: Path) -> None:
        """A checkpoint of FSDP (``fsdp_state/``, no ``optimizer.pt``): its sharded model and optimizer state, read
        whole (see :mod:`trainwell.backends.optimizer_state_forms`); otherwise nothing beyond the common checkpoint
        files."""
        folder = Path(folder)
        if self.optimizer is None or (folder / OPTIMIZER_NAME).is_file():
            return
        if (folder / FSDP_STATE_DIR / ".metadata").is_file():
            load_dcp_unsharded(prepared(self.model, "model"), self.optimizer, folder)
