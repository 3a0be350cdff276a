"""The facade users subclass: ``Trainer`` (trainer.py, every upstream method name) and the parts it is made of
(checkpoints.py, hub.py, compat.py, accelerator.py), and ``Seq2SeqTrainer`` (seq2seq.py)."""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """The names of the former module ``trainwell.trainer`` resolve from :mod:`.trainer`."""
    return getattr(importlib.import_module(".trainer", __name__), name)
