"""Data utilities: collators, resumable samplers, unused-column removal and dataloader building.

Names are resolved lazily (importing this package does not import torch until a name is used).
"""

from __future__ import annotations

from ..utils.lazy_exports import lazy_exports

_EXPORTS = {
    "collators": (
        "DataCollator", "DefaultDataCollator", "DataCollatorWithPadding", "DataCollatorForSeq2Seq",
        "DataCollatorForTokenClassification", "DataCollatorForLanguageModeling", "default_data_collator",
        "pad_sequences",
    ),
    "flattening": ("DataCollatorWithFlattening",),
    "multiple_choice": ("DataCollatorForMultipleChoice",),
    "samplers": (
        "ResumableSampler", "LengthGroupedSampler", "get_length_grouped_indices", "infer_lengths",
        "skip_first_batches",
    ),
    "columns": (
        "signature_columns", "RemoveColumnsCollator", "remove_unused_columns_from_dataset", "check_labels_present",
    ),
    "loader": ("PreparedDataLoader", "build_dataloader", "has_length"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
