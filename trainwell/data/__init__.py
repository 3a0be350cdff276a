"""Data utilities: collators, resumable samplers, unused-column removal and dataloader building.

Names are resolved lazily (importing this package does not import torch until a name is used).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "collators": (
        "DataCollator", "DefaultDataCollator", "DataCollatorWithPadding", "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification", "DataCollatorForLanguageModeling", "default_data_collator",
        "pad_sequences",
    ),
    "samplers": (
        "ResumableSampler", "LengthGroupedSampler", "get_length_grouped_indices", "infer_lengths",
        "skip_first_batches",
    ),
    "columns": (
        "signature_columns", "RemoveColumnsCollator", "remove_unused_columns_from_dataset", "check_labels_present",
    ),
    "loader": ("build_dataloader", "has_length"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainwell.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
