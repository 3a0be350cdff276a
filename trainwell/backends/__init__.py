"""Execution backends (one device, DDP, FSDP, DeepSpeed) behind one small interface; see ``base.Backend``.

The names below are resolved lazily, so that importing a light submodule (``backends.deepspeed.config``, which
``TrainingArguments`` reads) does not import torch through the registry.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Backend": "base", "Capabilities": "base", "build_backend": "registry"}

__all__ = ["Backend", "Capabilities", "build_backend"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # cache: later lookups skip this function
    return value
