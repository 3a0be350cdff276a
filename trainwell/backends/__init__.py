"""Execution backends (one device, DDP, FSDP, DeepSpeed) behind one small interface; see ``base.Backend``.

The names below are resolved lazily, so that importing a light submodule (``backends.deepspeed.config``, which
``TrainingArguments`` reads) does not import torch through the registry.
"""

from __future__ import annotations

from ..utils.lazy_exports import lazy_exports

_EXPORTS = {"Backend": "base", "Capabilities": "base", "build_backend": "registry"}

__all__ = ["Backend", "Capabilities", "build_backend"]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
