"""The ``trainwell`` command: the entry point and the train command (main.py), argument helpers (arguments.py),
the other commands (commands/) and the built-in recipes (recipes/)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """The names of the former module ``trainwell.cli`` resolve from :mod:`.main`."""
    return getattr(importlib.import_module(".main", __name__), name)
