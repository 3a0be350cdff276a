"""Execution backends (one device, DDP, FSDP, DeepSpeed) behind one small interface; see ``base.Backend``."""

from .base import Backend, Capabilities
from .registry import build_backend

__all__ = ["Backend", "Capabilities", "build_backend"]
