"""Cross-rank gathering for evaluation: every rank's outputs as separate parts, and dealing an unsharded stream.

Every function is the identity (or a single part) outside a process group. Every rank must make the same calls
with the same nested structure (the collectives pair up in order).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from .nested import _flatten, _unflatten, nested_map

PAD_INDEX = -100


def _gather_tensor_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """all_gather one tensor whose shape may differ between ranks: every rank's tensor, in rank order.

    The tensors are padded to the largest shape for the collective and each part is cut back to its rank's own
    shape, so no padding value ever reaches the caller.
    """
    import torch.distributed as dist

    tensor = torch.atleast_1d(tensor.detach()).contiguous()
    world_size = dist.get_world_size()
    shape = torch.tensor(tensor.shape, dtype=torch.long, device=tensor.device)
    shapes = [torch.empty_like(shape) for _ in range(world_size)]
    dist.all_gather(shapes, shape)
    sizes = [s.tolist() for s in shapes]
    max_shape = [max(size[d] for size in sizes) for d in range(tensor.ndim)]
    padded = tensor
    if list(tensor.shape) != max_shape:
        padded = tensor.new_zeros(max_shape)
        padded[tuple(slice(0, size) for size in tensor.shape)] = tensor
    parts = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(parts, padded)
    return [part[tuple(slice(0, d) for d in size)] for part, size in zip(parts, sizes)]


def gather_parts(nested: Any) -> list[Any]:
    """Every rank's nested structure of tensors, in rank order (``[nested]`` outside a process group).

    Each rank's tensors come back with their own shapes (no padding, no concatenation), so the caller can treat
    them exactly as the batches one process would have seen. Every rank must call this with the same structure.
    Leaves that are not tensors are kept as this rank's.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [nested]
    leaves, spec = _flatten(nested)
    device = _device_of(nested)
    # numpy outputs (a custom prediction_step) are gathered too, as tensors; other leaves stay this rank's
    leaves = [torch.from_numpy(leaf).to(device) if isinstance(leaf, np.ndarray) and leaf.dtype != object else leaf
              for leaf in leaves]
    gathered = [_gather_tensor_parts(leaf) if isinstance(leaf, torch.Tensor) else None for leaf in leaves]
    return [_unflatten(spec, [parts[rank] if parts is not None else leaf for leaf, parts in zip(leaves, gathered)])
            for rank in range(dist.get_world_size())]


def _concat_padded(parts: list[torch.Tensor], pad_index: int) -> torch.Tensor:
    """Concatenate along dim 0, padding the trailing dims of each part on the right with ``pad_index``."""
    max_shape = [max(part.shape[d] for part in parts) for d in range(1, parts[0].ndim)]
    padded = []
    for part in parts:
        if list(part.shape[1:]) != max_shape:
            full = part.new_full([part.shape[0], *max_shape], pad_index)
            full[tuple(slice(0, size) for size in part.shape)] = part
            part = full
        padded.append(part)
    return torch.cat(padded, dim=0)


def gather_across_ranks(nested: Any, pad_index: int = PAD_INDEX) -> Any:
    """Gather a nested structure of tensors from every rank (identity outside a process group).

    Each tensor is padded to the largest shape across ranks (dim 1, the sequence dim, and any other trailing
    dim, with ``pad_index``); the results are concatenated along dim 0 in rank order.
    Every rank must call this with the same structure.
    """
    import torch.distributed as dist

    if nested is None or not (dist.is_available() and dist.is_initialized()):
        return nested
    leaves, spec = _flatten(nested)
    merged = [_concat_padded(_gather_tensor_parts(leaf), pad_index) if isinstance(leaf, torch.Tensor) else leaf
              for leaf in leaves]
    return _unflatten(spec, merged)


def keep_rows(nested: Any, batch_size: int | None, rows: int) -> Any:
    """The first ``rows`` rows of every leaf whose first dimension is the batch (``batch_size``)."""
    if nested is None or batch_size is None or rows >= batch_size:
        return nested
    return nested_map(lambda x: x[:rows] if getattr(x, "ndim", 0) > 0 and x.shape[0] == batch_size else x, nested)


def _device_of(nested: Any) -> torch.device:
    """The device of the first tensor in ``nested`` (CPU when there is none): where a collective must run."""
    leaves, _ = _flatten(nested)
    return next((leaf.device for leaf in leaves if isinstance(leaf, torch.Tensor)), torch.device("cpu"))


def _is_dist() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _sum_across_ranks(value: int, device: torch.device) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return value
    total = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(total)
    return int(total.item())


def _round_robin(batches: Iterable[Any], rank: int, world_size: int) -> Iterator[tuple[Any, int | None]]:
    """This rank's batches of a stream that every rank reads whole (an ``IterableDataset`` is not sharded).

    Batch ``i`` goes to rank ``i % world_size``, so gathering a step's batches in rank order gives the stream's
    order. In the last group a rank without a batch of its own runs the group's first batch as a placeholder
    (``(batch, 0)``: no real sample), so that every rank takes part in the same number of collectives. Like
    accelerate's batch dispatching, this expects the whole stream on every rank (not one pre-split per rank).
    """
    iterator = iter(batches)
    while True:
        group = list(itertools.islice(iterator, world_size))
        if not group:
            return
        yield (group[rank], None) if rank < len(group) else (group[0], 0)
