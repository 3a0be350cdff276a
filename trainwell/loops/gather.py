"""Cross-rank gathering for evaluation: every rank's outputs as separate parts, and dealing an unsharded stream.

Every function is the identity (or a single part) outside a process group. Every rank must make the same calls
with the same nested structure (the collectives pair up in order).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch

from .nested import _flatten, _unflatten, nested_map

PAD_INDEX = -100


def _exchange_shapes(tensors: list[torch.Tensor], world_size: int) -> list[list[tuple[int, ...]]]:
    """Every rank's shapes of ``tensors`` (``shapes[rank][leaf]``), in one all_gather."""
    import torch.distributed as dist

    header = torch.tensor([value for t in tensors for value in (t.ndim, *t.shape)], dtype=torch.long,
                          device=tensors[0].device)
    headers = [torch.empty_like(header) for _ in range(world_size)]
    dist.all_gather(headers, header)
    shapes = []
    for values in (h.tolist() for h in headers):
        rank_shapes, pos = [], 0
        for _ in tensors:
            ndim = values[pos]
            rank_shapes.append(tuple(values[pos + 1:pos + 1 + ndim]))
            pos += 1 + ndim
        shapes.append(rank_shapes)
    return shapes


def _gather_leaves(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """all_gather tensors whose shapes may differ between ranks: ``parts[leaf][rank]``, each with its own shape.

    One collective exchanges the shapes, then one per (dtype, device): each rank sends its tensors flattened
    into one buffer (padded at the end to the longest rank's), so the cost does not grow with the number of
    outputs and no padding value ever reaches the caller.
    """
    import torch.distributed as dist

    world_size = dist.get_world_size()
    tensors = [torch.atleast_1d(t.detach()) for t in tensors]
    shapes = _exchange_shapes(tensors, world_size)
    parts: list[list[Any]] = [[None] * world_size for _ in tensors]
    groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
    for i, tensor in enumerate(tensors):
        groups.setdefault((tensor.dtype, tensor.device), []).append(i)
    for (dtype, device), leaves in groups.items():
        wire = torch.uint8 if dtype == torch.bool else dtype  # gloo has no bool collectives
        sizes = [[math.prod(shapes[rank][i]) for i in leaves] for rank in range(world_size)]
        longest = max(sum(rank_sizes) for rank_sizes in sizes)
        buffers = [torch.zeros(longest, dtype=wire, device=device) for _ in range(world_size)]
        if longest:
            local = torch.cat([tensors[i].reshape(-1).to(wire) for i in leaves])
            send = torch.cat([local, local.new_zeros(longest - local.numel())]) if local.numel() < longest else local
            dist.all_gather(buffers, send)
        for rank in range(world_size):
            offset = 0
            for i, size in zip(leaves, sizes[rank]):
                parts[i][rank] = buffers[rank][offset:offset + size].view(shapes[rank][i]).to(dtype)
                offset += size
    return parts


def gather_parts(nested: Any, gather_objects: bool = False) -> list[Any]:
    """Every rank's nested structure of tensors, in rank order (``[nested]`` outside a process group).

    Each rank's tensors come back with their own shapes (no padding, no concatenation), so the caller can treat
    them exactly as the batches one process would have seen. Every rank must call this with the same structure.
    Leaves that are not tensors are kept as this rank's, or, with ``gather_objects`` (``eval_use_gather_object``),
    gathered too by pickling (``all_gather_object``: one more collective, only when there are such leaves).
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [nested]
    leaves, spec = _flatten(nested)
    device = _device_of(nested)
    # numpy outputs (a custom prediction_step) are gathered too, as tensors; other leaves stay this rank's
    leaves = [torch.from_numpy(leaf).to(device) if isinstance(leaf, np.ndarray) and leaf.dtype != object else leaf
              for leaf in leaves]
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    gathered: list[Any] = [None] * len(leaves)
    if positions:
        for i, parts in zip(positions, _gather_leaves([leaves[i] for i in positions])):
            gathered[i] = parts
    objects = [i for i, leaf in enumerate(leaves) if leaf is not None and not isinstance(leaf, torch.Tensor)]
    if gather_objects and objects:
        every_rank: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every_rank, [leaves[i] for i in objects])
        for j, i in enumerate(objects):
            gathered[i] = [rank_objects[j] for rank_objects in every_rank]
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


#: while the evaluation loop predicts a batch on several ranks: whether this rank's batch is a placeholder (see
#: :class:`~trainwell.data.samplers.EvalShardSampler`); None outside (every rank agrees, so the calls pair up)
_PLACEHOLDER: ContextVar[bool | None] = ContextVar("trainwell_placeholder_batch", default=None)


@contextmanager
def predicting_batch(placeholder: bool) -> Iterator[None]:
    """Mark the batch this rank predicts in the body as a placeholder (or a real one): what a library gathers
    meanwhile (TRL's metrics through ``trainer.accelerator.gather``) leaves out the placeholder ranks' rows, so a
    sample counts once, as in one process. Every rank must enter it for the same batch."""
    token = _PLACEHOLDER.set(placeholder)
    try:
        yield
    finally:
        _PLACEHOLDER.reset(token)


def is_placeholder_batch() -> bool:
    """True while this rank predicts an evaluation's placeholder batch (:func:`predicting_batch`)."""
    return bool(_PLACEHOLDER.get())


def gather_real_parts(nested: Any, gather_objects: bool = False) -> list[Any]:
    """:func:`gather_parts` less the parts of ranks predicting a placeholder batch (:func:`predicting_batch`);
    every part outside one, or when every rank's batch is a placeholder."""
    placeholder = _PLACEHOLDER.get()
    if placeholder is None:
        return gather_parts(nested, gather_objects)
    flag = torch.tensor([int(placeholder)], device=_device_of(nested))
    parts = gather_parts((flag, nested), gather_objects)
    return [part for flag, part in parts if not int(flag[0])] or [part for _, part in parts]


def gather_across_ranks(nested: Any, pad_index: int = PAD_INDEX) -> Any:
    """Gather a nested structure of tensors from every rank (identity outside a process group).

    Each tensor is padded to the largest shape across ranks (dim 1, the sequence dim, and any other trailing
    dim, with ``pad_index``); the results are concatenated along dim 0 in rank order. The ranks predicting an
    evaluation's placeholder batch give nothing (:func:`predicting_batch`).
    Every rank must call this with the same structure.
    """
    import torch.distributed as dist

    if nested is None or not (dist.is_available() and dist.is_initialized()):
        return nested
    parts = gather_real_parts(nested)
    leaves, spec = _flatten(nested)
    rank_leaves = [_flatten(part)[0] for part in parts]
    merged = [_concat_padded([rank[i] for rank in rank_leaves], pad_index) if isinstance(leaf, torch.Tensor)
              else leaf for i, leaf in enumerate(leaves)]
    return _unflatten(spec, merged)


def keep_rows(nested: Any, batch_size: int | None, rows: int | None) -> Any:
    """The first ``rows`` rows of every leaf whose first dimension is the batch (``batch_size``); ``rows`` is None
    only when ``batch_size`` is (the rows cannot be told: the leaves are kept whole)."""
    if nested is None or batch_size is None or rows is None or rows >= batch_size:
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
