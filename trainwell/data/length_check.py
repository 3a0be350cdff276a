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
        self.resumed = 0  # examples of the next pass yielded before a resume (the stream restored its position)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        if name in ("dataset", "description", "resumed"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __iter__(self) -> Iterator[Any]:
        expected = len(self.dataset)
        count, self.resumed = self.resumed, 0
        for item in self.dataset:
            count += 1
            if count > expected:  # raised when the loader asks for an example beyond __len__
                raise ValueError(self._message(f"more than {expected}", expected))
            yield item
        if count != expected:
            raise ValueError(self._message(str(count), expected))

    def resume_count(self, examples: int) -> None:
        """The next pass starts ``examples`` in (the wrapped dataset restored its saved position): count from there."""
        self.resumed = examples

    def _message(self, count: str, expected: int) -> str:
        return (f"The {self.description} dataset ({type(self.dataset).__name__}) yielded {count} examples in one "
                f"pass but its __len__ returns {expected}; the steps and epochs are planned from __len__, so "
                "examples would be silently dropped or the plan would be wrong. Make __len__ return the number of "
                "examples one pass yields, or remove __len__ and set max_steps.")


def _raised_in_getitem(error: BaseException, dataset: Any) -> bool:
    """Whether ``error`` was raised inside ``type(dataset).__getitem__`` (its frame is in the traceback)."""
    code = getattr(getattr(type(dataset), "__getitem__", None), "__code__", None)
    trace = error.__traceback__
    while trace is not None:
        if trace.tb_frame.f_code is code:
            return True
        trace = trace.tb_next
    return False


def _first_missing_index(dataset: Any, length: int) -> int | None:
    """The first index below ``length`` that ``dataset[i]`` refuses with ``IndexError`` (a bisection: the items a
    lying ``__len__`` over-counts are the last ones), or None when the last one is served."""
    def refused(index: int) -> bool:
        try:
            dataset[index]
        except IndexError:
            return True
        return False

    if length <= 0 or not refused(length - 1):
        return None
    low, high = 0, length - 1  # high is refused
    while low < high:
        middle = (low + high) // 2
        if refused(middle):
            high = middle
        else:
            low = middle + 1
    return low


def explain_index_error(error: IndexError, dataset: Any, description: str) -> ValueError | None:
    """The cause and the fix when the loader's ``dataset[i]`` raised ``IndexError`` for an index below
    ``len(dataset)`` (its ``__len__`` over-counts); None for any other ``IndexError``. Reads the dataset again only
    on this error path, at a few indices."""
    if dataset is None or isinstance(dataset, torch.utils.data.IterableDataset) or not _raised_in_getitem(
            error, dataset):
        return None
    try:
        length = len(dataset)
        missing = _first_missing_index(dataset, length)
    except Exception:  # the dataset cannot be probed: its own error stands
        return None
    if missing is None:
        return None
    name = type(dataset).__name__
    return ValueError(
        f"The {description} dataset ({name}) says len() == {length} but {description}_dataset[{missing}] raises "
        f"IndexError ({error}); the sampler draws every index below len(), so make {name}.__len__ return the "
        f"number of items __getitem__ serves ({missing} here).")
