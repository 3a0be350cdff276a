"""Catching a dataset whose ``__len__`` disagrees with what it yields (steps and epochs are planned from it).

An ``IterableDataset`` with a ``__len__`` is counted while it is iterated (one integer increment per example): a
pass that ends early raises when it ends, one that goes on raises when the example beyond ``__len__`` is asked for
(a single-epoch run that stops at ``max_steps`` never asks, and trains exactly the planned examples). No extra pass
over the data is made. A map-style dataset is read only at the indices its sampler draws from ``range(len)``, so a
``__len__`` smaller than its data cannot be seen without reading beyond it, which trainwell does not do (an extra
read is an extra side effect and cost for every run).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["LengthCheckedIterable"]


class LengthCheckedIterable(torch.utils.data.IterableDataset):
    """Wrap an ``IterableDataset`` with ``__len__``: a full pass that yields another count raises ``ValueError``.

    Attributes (``set_epoch``, ``column_names``...) are forwarded to the wrapped dataset. Used only when examples
    are loaded in the main process: with workers each process yields its own share.
    """

    def __init__(self, dataset: Any, description: str) -> None:
        self.dataset = dataset
        self.description = description

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "description"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __iter__(self) -> Iterator[Any]:
        expected = len(self.dataset)
        count = 0
        for item in self.dataset:
            count += 1
            if count > expected:  # raised when the loader asks for an example beyond __len__
                raise ValueError(self._message(f"more than {expected}", expected))
            yield item
        if count != expected:
            raise ValueError(self._message(str(count), expected))

    def _message(self, count: str, expected: int) -> str:
        return (f"The {self.description} dataset ({type(self.dataset).__name__}) yielded {count} examples in one "
                f"pass but its __len__ returns {expected}; the steps and epochs are planned from __len__, so "
                "examples would be silently dropped or the plan would be wrong. Make __len__ return the number of "
                "examples one pass yields, or remove __len__ and set max_steps.")
