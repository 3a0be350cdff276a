"""TensorFlow: ``TFTrainer`` and ``TFTrainingArguments`` (the upstream seed's TensorFlow trainer, on Keras 3).

Nothing else in trainwell imports this subpackage; importing :class:`TFTrainingArguments` alone does not import
TensorFlow (only its ``strategy`` does), :class:`TFTrainer` does. Install with ``pip install 'trainwell[tensorflow]'``.
"""

from __future__ import annotations

from typing import Any

from .args import TFTrainingArguments

__all__ = ["TFTrainer", "TFTrainingArguments", "create_optimizer", "WarmUp"]


def __getattr__(name: str) -> Any:
    if name == "TFTrainer":
        from .trainer import TFTrainer

        return TFTrainer
    if name in ("create_optimizer", "WarmUp"):
        from . import optimization

        return getattr(optimization, name)
    raise AttributeError(f"module 'trainwell.tf' has no attribute {name!r}")
