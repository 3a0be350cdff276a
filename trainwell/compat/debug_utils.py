"""``trainwell.debug_utils``, under upstream's module name (``transformers.debug_utils``): the underflow/overflow
detector and the debug options."""

from __future__ import annotations

from ..args.fields import DebugOption
from ..loops.underflow_overflow import DebugUnderflowOverflow, detect_overflow, get_abs_min_max

__all__ = ["DebugUnderflowOverflow", "DebugOption", "detect_overflow", "get_abs_min_max"]
