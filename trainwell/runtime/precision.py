"""Mixed precision: the autocast context and the gradient scaler, as objects that are no-ops when disabled."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

_NULL = nullcontext()


class Precision:
    """Autocast dtype and loss scaling for one device.

    ``fp16`` uses a :class:`torch.amp.GradScaler`; ``bf16`` needs none. With neither, :meth:`autocast` returns a shared
    ``nullcontext`` and the scaler is created disabled, so the training step has no precision branches.
    """

    def __init__(self, device: torch.device, *, dtype: torch.dtype | None = None) -> None:
        self.device = device
        self.dtype = dtype
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    @classmethod
    def from_args(cls, args: Any, device: torch.device) -> "Precision":
        """Read ``fp16``/``bf16`` (and ``half_precision_backend``) from the training arguments."""
        if getattr(args, "fp16", False):
            backend = getattr(args, "half_precision_backend", "auto")
            if backend == "apex":
                raise ImportError(
                    "half_precision_backend='apex' (fp16_opt_level) needs NVIDIA apex, which trainwell does not use; "
                    "set half_precision_backend='auto' to use torch.amp"
                )
            return cls(device, dtype=torch.float16)
        if getattr(args, "bf16", False):
            return cls(device, dtype=torch.bfloat16)
        return cls(device)

    @property
    def enabled(self) -> bool:
        """True when autocast is on."""
        return self.dtype is not None

    def autocast(self) -> AbstractContextManager[Any]:
        """Context for the forward pass: ``torch.autocast`` in the chosen dtype, or a no-op."""
        if self.dtype is None:
            return _NULL
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)
