"""``DataCollatorForMultipleChoice``: pad every choice of every example to one length, shaped
``[batch, num_choices, length]`` (upstream's collator for ``*ForMultipleChoice`` models)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .collators import _check_return_tensors, _pad_batch

__all__ = ["DataCollatorForMultipleChoice"]


@dataclass
class DataCollatorForMultipleChoice:
    """Collate examples whose features are one list per choice (``input_ids: [[choice 0], [choice 1], ...]``).

    Args:
        tokenizer: a ``transformers`` tokenizer (its ``pad`` is used), or any object with ``pad_token_id`` and
            ``padding_side`` for trainwell's built-in padding.
        padding: ``True``/``"longest"``, ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: target length for ``padding="max_length"``.
        pad_to_multiple_of: round the padded length up to this multiple.
        return_tensors: ``"pt"`` or ``"np"``.

    The label of each example (``label`` or ``labels``: one int, the right choice) becomes ``labels`` (int64).
    """

    deterministic: ClassVar[bool] = True  # draws no random numbers: the look-ahead keeps no states

    tokenizer: Any
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: list[dict[str, Any]], return_tensors: str | None = None) -> dict[str, Any]:
        """Pad the choices of ``features``; ``return_tensors`` overrides the instance setting for this call."""
        return_tensors = return_tensors or self.return_tensors
        _check_return_tensors(return_tensors)
        label_name = "label" if "label" in features[0] else "labels"
        labels = [example[label_name] for example in features]
        num_choices = len(features[0]["input_ids"])
        # every choice as an example of its own, padded like any batch, then shaped back to [B, C, L]
        flat = [{key: value[i] for key, value in example.items() if key != label_name}
                for example in features for i in range(num_choices)]
        padded = _pad_batch(flat, self.tokenizer, self.padding, self.max_length, self.pad_to_multiple_of, "pt")
        batch = {key: torch.as_tensor(value).view(len(features), num_choices, -1) for key, value in padded.items()}
        batch["labels"] = torch.tensor(labels, dtype=torch.int64)
        if return_tensors == "np":
            return {key: value.numpy() for key, value in batch.items()}
        return batch
