"""Models that place themselves: a ``device_map`` over several devices (or another device than the trainer's), the
older ``is_parallelizable`` + ``model_parallel`` switch, bitsandbytes 4/8-bit weights. The trainer never moves them
with ``.to()`` and never wraps them in ``DataParallel`` (upstream ``Trainer.__init__``)."""

from __future__ import annotations

import torch
from torch import nn


def is_model_parallel(model: nn.Module, device: torch.device | str) -> bool:
    """Upstream's rule (``Trainer.__init__``, transformers 5): the devices of ``model.hf_device_map`` other than
    ``"cpu"``/``"disk"``: several -> model parallel; exactly one -> model parallel when it is not ``device``. Without a
    map, transformers 4's ``is_parallelizable and model_parallel``."""
    device_map = getattr(model, "hf_device_map", None)
    if device_map is not None:
        devices = {d for d in device_map.values() if d not in ("cpu", "disk")}
        if len(devices) > 1:
            return True
        if len(devices) == 1:
            return torch.device(device) != _as_device(next(iter(devices)))
    return bool(getattr(model, "is_parallelizable", False) and getattr(model, "model_parallel", False))


def places_itself(model: nn.Module, device: torch.device | str) -> bool:
    """Model parallel, or loaded in bitsandbytes 4/8-bit (``.to`` raises on it; upstream skips it by
    ``quantization_method``): the model stays where loading put it."""
    method = getattr(getattr(model, "quantization_method", None), "value", getattr(model, "quantization_method", None))
    return (is_model_parallel(model, device) or method == "bitsandbytes"
            or bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)))


def _as_device(value: int | str | torch.device) -> torch.device:
    """A ``device_map`` value as a device: an index is one of the accelerator's (``torch.device(0)``, which raises
    where there is no accelerator)."""
    if isinstance(value, int):
        accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        return torch.device(accelerator.type if accelerator is not None else "cuda", value)
    return torch.device(value)
