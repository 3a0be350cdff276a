"""The rows a distributed evaluation gathered twice: the samples a sampler repeated to even out the ranks, dropped
from the last batch as accelerate's ``gather_for_metrics`` drops them."""

from __future__ import annotations

from collections.abc import Sized
from typing import Any, cast

import torch
import torch.distributed as dist

from .accumulate import find_batch_size
from .gather import keep_rows


class RemainderCut:
    """Drops the samples a distributed sampler repeated to even out the ranks, for a loader whose sampler does not
    say which of its batches are real (torch's ``DistributedSampler``, a user's batch sampler).

    As accelerate's ``gather_for_metrics`` does, the rows gathered past ``len(dataset)`` in the last batch are
    dropped. Such a sampler repeats fewer than ``world_size`` samples; a larger excess means the collator puts
    several rows per sample (a preference pair), and then nothing is cut (the rows cannot be told apart).
    A loader split by accelerate's ``BatchSamplerShard`` with even batches (a library's, or an override's sampler:
    :func:`~trainwell.data.sharding.shard_dataloader`) follows ``gather_for_metrics`` exactly: the last step keeps
    its first ``len(dataset) % (batch_size * world_size)`` gathered rows, so its numbers are upstream's.
    """

    def __init__(self, dataloader: Any) -> None:
        dataset = getattr(dataloader, "dataset", None)
        sized = hasattr(dataset, "__len__") and not isinstance(dataset, torch.utils.data.IterableDataset)
        self.limit: int | None = len(cast("Sized", dataset)) if sized else None
        self.world_size = dist.get_world_size()
        self.rows = 0
        # a loader split as accelerate splits it (a library's, an override's sampler): accelerate's own rule
        self.remainder = even_batches_remainder(dataloader)

    def cut(self, parts: list[tuple[Any, Any, Any, Any]], is_last: bool) -> list[tuple[Any, Any, Any, Any]]:
        """The batch's parts (one per rank, in rank order), the last batch's repeated rows dropped."""
        sizes = [part_rows(part) for part in parts]
        if None in sizes or (self.limit is None and self.remainder is None):
            return parts
        if self.remainder is not None:  # gather_for_metrics: the last step keeps its first `remainder` rows
            budget = self.remainder
            if not is_last or budget == 0:
                return parts
        else:
            self.rows += sum(cast("list[int]", sizes))
            excess = self.rows - cast(int, self.limit)
            if not is_last or not 0 < excess < self.world_size:
                return parts
            budget = sum(cast("list[int]", sizes)) - excess
        kept: list[tuple[Any, Any, Any, Any]] = []
        for part, size in zip(parts, cast("list[int]", sizes)):
            rows = min(size, budget)
            budget -= rows
            if rows > 0:
                loss = part[0][:rows] if part[0] is not None else None
                kept.append((loss, *keep_rows(part[1:], size, rows)))
        return kept


def part_rows(part: tuple[Any, Any, Any, Any]) -> int | None:
    """The rows of one rank's part: its per-sample losses, else its predictions' or labels' leading dimension."""
    if part[0] is not None and getattr(part[0], "ndim", 0) == 1:
        return int(part[0].shape[0])
    return find_batch_size(part[1]) if part[1] is not None else find_batch_size(part[2])


def even_batches_remainder(loader: Any) -> int | None:
    """For a loader :func:`~trainwell.data.sharding.shard_dataloader` split with even batches: how many of the rows gathered from the
    processes at the last step are real, as accelerate's ``gather_for_metrics`` counts them (``len(dataset) %``
    the batch size of all processes; 0 when every row is: nothing was repeated). None for any other loader."""
    holder: Any = loader.sampler if isinstance(getattr(loader, "sampler", None), torch.utils.data.BatchSampler) \
        else getattr(loader, "batch_sampler", None)
    if type(holder).__name__ != "BatchSamplerShard" or not holder.even_batches or holder.drop_last \
            or holder.batch_size is None:
        return None
    dataset = loader.dataset
    length = getattr(dataset, "total_length", None)
    try:
        length = len(dataset) if length is None else int(length)
    except TypeError:
        return None
    return length % (holder.batch_size * holder.num_processes)
