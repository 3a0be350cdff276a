"""How the Trainer moves a batch to the device (``_prepare_input`` / ``_prepare_inputs``).

A :class:`BatchMover` is picked once per run for the device and the dtype the backend's engine wants its
floating-point inputs in (DeepSpeed's, as upstream; None: as they are), so that the step itself has no dtype or device
branch: the common batch, a flat dict of tensors from a collator, goes through one dict comprehension (on the CPU, not
even that when every value is a CPU tensor already).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any, cast

import torch

__all__ = ["BatchMover"]

_ONLY_TENSORS = {torch.Tensor}
_IS_CPU = attrgetter("is_cpu")


class BatchMover:
    """Moves batches to ``device``, casting floating-point tensors to ``dtype`` when it is set.

    ``nested`` moves a value of a flat batch that is not a tensor (the Trainer's ``_prepare_input``, so that an
    override of it is used there); :meth:`flat` is the mover of flat dicts chosen for this device and dtype.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype | None = None,
                 nested: Callable[[Any], Any] | None = None) -> None:
        self.device, self.dtype = device, dtype
        self.nested = nested if nested is not None else self.move
        self.flat: Callable[[dict[str, Any]], dict[str, Any]]
        if dtype is not None:
            self.flat = self._flat_cast
        elif device.type == "cpu":
            self.flat = self._flat_on_cpu
        else:
            self.flat = self._flat

    def move(self, data: Any) -> Any:
        """``data`` (a tensor, or mappings, lists and tuples of them) on the device; other values as they are."""
        if isinstance(data, torch.Tensor):
            if self.dtype is not None and (data.is_floating_point() or data.is_complex()):
                return data.to(self.device, dtype=self.dtype, non_blocking=True)
            return data.to(self.device, non_blocking=True)
        if isinstance(data, Mapping):
            return cast(Any, type(data))({k: self.move(v) for k, v in data.items()})
        if isinstance(data, (tuple, list)):
            return type(data)(self.move(v) for v in data)
        return data

    def _flat(self, inputs: dict[str, Any]) -> dict[str, Any]:
        device, nested = self.device, self.nested
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else nested(v)
                for k, v in inputs.items()}

    def _flat_cast(self, inputs: dict[str, Any]) -> dict[str, Any]:
        device, dtype, nested = self.device, self.dtype, self.nested
        return {k: (v.to(device, dtype=dtype, non_blocking=True) if v.is_floating_point() or v.is_complex()
                    else v.to(device, non_blocking=True)) if isinstance(v, torch.Tensor) else nested(v)
                for k, v in inputs.items()}

    def _flat_on_cpu(self, inputs: dict[str, Any]) -> dict[str, Any]:
        values = inputs.values()
        if set(map(type, values)) == _ONLY_TENSORS and all(map(_IS_CPU, values)):  # checked in C, whatever the keys
            return dict(inputs)  # the common case, all CPU tensors: a copy (compute_loss may pop from it)
        return {k: v if type(v) is torch.Tensor and v.is_cpu else self.nested(v) for k, v in inputs.items()}
