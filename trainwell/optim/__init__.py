"""Optimisation: the optimizer factory and parameter groups (factory.py), the optional optimizer packages
(extras.py) and the learning-rate schedules (schedules.py)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """The names of the former module ``trainwell.optim`` resolve from :mod:`.factory`."""
    return getattr(importlib.import_module(".factory", __name__), name)
