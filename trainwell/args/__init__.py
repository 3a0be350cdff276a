"""Configuration as data: ``TrainingArguments`` (fields.py, the reference users read), its seq2seq variant
(seq2seq.py), the argument parser (parser.py) and the bookkeeping of which fields a run read (field_usage.py)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """The names of the former module ``trainwell.args`` resolve from :mod:`.fields`."""
    return getattr(importlib.import_module(".fields", __name__), name)
