"""``DataCollatorWithFlattening``: padding-free batches (what TRL's ``padding_free=True`` uses).

The examples of a batch are concatenated into one row ``[1, total_tokens]`` with no padding. So that a model sees
the sequence boundaries, ``position_ids`` restart at every sequence (models built on transformers' attention read
them to keep sequences apart), and ``labels`` hold ``separator_id`` (-100) at each sequence's first token, so no
token is trained to predict the next sequence's start. Upstream's options and output, key for key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

__all__ = ["DataCollatorWithFlattening"]

_INT64_KEYS = frozenset({"input_ids", "labels", "position_ids"})
_ROW_KEYS = frozenset({"input_ids", "labels", "position_ids", "seq_idx"})  # get the leading dimension of 1
_PYTHON_INT_KEYS = frozenset({"max_length_q", "max_length_k"})


def _as_list(values: Any) -> list[int]:
    return values.tolist() if hasattr(values, "tolist") else list(values)


@dataclass
class DataCollatorWithFlattening:
    """Concatenate a batch of ``input_ids`` (and ``labels``) into one padding-free row.

    Args:
        return_tensors: ``"pt"`` or ``"np"``.
        return_position_ids: add ``position_ids`` counting from ``position_ids_start`` within every sequence.
        separator_id: the label at each sequence's first token (default -100: not trained on).
        return_flash_attn_kwargs: add ``cu_seq_lens_q``/``cu_seq_lens_k`` (the cumulative sequence lengths, int32)
            and ``max_length_q``/``max_length_k`` (the longest sequence, a Python int).
        return_seq_idx: add ``seq_idx`` (int32): the index of the sequence each token belongs to.
        position_ids_start: the first position of every sequence (2 for RoBERTa-like absolute positions).

    Without ``labels`` in the examples, the labels are the ``input_ids`` (each sequence's first one replaced by
    ``separator_id``); empty examples are dropped, and a batch with nothing left is an error.
    """

    deterministic: ClassVar[bool] = True  # draws no random numbers: the look-ahead keeps no states

    return_tensors: str = "pt"
    return_position_ids: bool = field(default=True, kw_only=True)
    separator_id: int = field(default=-100, kw_only=True)
    return_flash_attn_kwargs: bool = field(default=False, kw_only=True)
    return_seq_idx: bool = field(default=False, kw_only=True)
    position_ids_start: int = field(default=0, kw_only=True)

    def __call__(self, features: list[Any], return_tensors: str | None = None,
                 separator_id: int | None = None) -> dict[str, Any]:
        """One flattened batch of ``features``; the arguments override the instance settings for this call."""
        return_tensors = return_tensors or self.return_tensors
        separator = self.separator_id if separator_id is None else separator_id
        features = [f for f in features if len(f["input_ids"]) > 0]
        if not features:
            raise ValueError("DataCollatorWithFlattening received a batch where every example is empty "
                             "(no input_ids): filter empty examples out of the dataset.")
        batch = self._concatenate(features, separator)
        return self._to_tensors(batch, return_tensors)

    def _concatenate(self, features: list[Any], separator: int) -> dict[str, Any]:
        has_labels = "labels" in features[0]
        batch: dict[str, Any] = {"input_ids": [], "labels": []}
        if self.return_position_ids:
            batch["position_ids"] = []
        if self.return_seq_idx:
            batch["seq_idx"] = []
        boundaries = [0]
        for index, example in enumerate(features):
            ids = _as_list(example["input_ids"])
            targets = _as_list(example["labels"]) if has_labels else ids
            batch["input_ids"] += ids
            batch["labels"] += [separator] + targets[1:]
            if self.return_position_ids:
                batch["position_ids"] += range(self.position_ids_start, self.position_ids_start + len(ids))
            if self.return_seq_idx:
                batch["seq_idx"] += [index] * len(ids)
            boundaries.append(boundaries[-1] + len(ids))
        if self.return_flash_attn_kwargs:
            longest = max(b - a for a, b in zip(boundaries, boundaries[1:]))
            batch["cu_seq_lens_q"] = batch["cu_seq_lens_k"] = boundaries
            batch["max_length_q"] = batch["max_length_k"] = longest
        return batch

    @staticmethod
    def _to_tensors(batch: dict[str, Any], return_tensors: str) -> dict[str, Any]:
        if return_tensors == "pt":
            import torch  # the numpy path runs without torch

            make: Any = torch.tensor
            wide: Any = torch.int64
            narrow: Any = torch.int32
        elif return_tensors == "np":
            make, wide, narrow = np.array, np.int64, np.int32
        else:
            raise ValueError(f"return_tensors={return_tensors!r} is not supported by DataCollatorWithFlattening; "
                             "use 'pt' or 'np'.")
        for key, values in batch.items():
            if key in _PYTHON_INT_KEYS:
                continue
            batch[key] = make([values] if key in _ROW_KEYS else values,
                              dtype=wide if key in _INT64_KEYS else narrow)
        return batch
