"""Weights of a sharded model written tensor by tensor, so that the peak host memory of a save is one tensor.

A sharded backend (ZeRO-3, FSDP2) describes its weights without gathering them (name, dtype, full shape: all known
from the partitioned parameters) and gathers them one at a time when asked: :class:`StreamedWeights`. Every rank
must walk the whole stream in the same order (each gather is a collective); only the writing rank keeps the
tensors it receives, and :func:`write_streamed` writes each one into the safetensors file as soon as it arrives: the
file's header (names, dtypes, shapes, offsets) is written first, from the description alone.

Tied weights (one parameter under several names) are gathered and written once; the other names are recorded as
aliases in the file metadata, as :func:`trainwell.checkpoint.weights.dedupe_shared_tensors` does.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from . import digest

# safetensors' dtype names
_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64", "int32": "I32",
           "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


@dataclass(frozen=True)
class Entry:
    """One tensor of the stream: its name, dtype and full (unsharded) shape."""

    name: str
    dtype: "torch.dtype"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size of the full tensor in bytes."""
        count = 1
        for dim in self.shape:
            count *= int(dim)
        return count * torch.empty((), dtype=self.dtype).element_size()


class StreamedWeights:
    """A model's weights, gathered one tensor at a time on demand (a collective: every rank walks it all).

    ``entries``: the tensors in stream order; ``fetch(i)``: gathers tensor ``i`` (called on every rank, in order)
    and returns it on the CPU on the writing rank, None on the others; ``aliases``: ``{other name: written name}``.
    A stream is walked once: :meth:`drain` walks what is left (the non-writing ranks, or after a writer's error,
    so that the collectives stay matched).
    """

    def __init__(self, entries: list[Entry], fetch: Callable[[int], "torch.Tensor | None"],
                 aliases: dict[str, str] | None = None) -> None:
        self.entries = entries
        self.aliases = dict(aliases or {})
        self._fetch = fetch
        self._next = 0

    def take(self, index: int) -> "torch.Tensor | None":
        """Gather tensor ``index``, which must be the next one of the stream."""
        if index != self._next:
            raise RuntimeError(f"streamed weights taken out of order ({index} after {self._next - 1}): every rank "
                               "must gather the tensors in the same order")
        self._next += 1
        return self._fetch(index)

    def drain(self) -> None:
        """Gather (and drop) every tensor not taken yet."""
        while self._next < len(self.entries):
            self.take(self._next)

    def materialize(self) -> dict[str, "torch.Tensor"]:
        """The whole state dict (writing rank; ``{}`` elsewhere), aliases included: for writers that cannot stream."""
        out: dict[str, Any] = {}
        for i, entry in enumerate(self.entries):
            tensor = self.take(i)
            if tensor is not None:
                out[entry.name] = tensor
        for alias, name in self.aliases.items():
            if name in out:
                out[alias] = out[name]
        return out


def _header(entries: list[Entry], metadata: dict[str, str]) -> bytes:
    """The safetensors header of ``entries`` laid out in order, padded to 8 bytes (the format's alignment)."""
    record: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for entry in entries:
        name = str(entry.dtype).replace("torch.", "")
        if name not in _DTYPES:
            raise ValueError(f"{entry.name}: dtype {entry.dtype} cannot be written to safetensors")
        record[entry.name] = {"dtype": _DTYPES[name], "shape": list(entry.shape),
                              "data_offsets": [offset, offset + entry.nbytes]}
        offset += entry.nbytes
    text = json.dumps(record, separators=(",", ":")).encode("utf-8")
    return text + b" " * (-len(text) % 8)


def write_streamed_file(stream: StreamedWeights, indices: list[int], path: Path,
                        metadata: dict[str, str]) -> None:
    """Write tensors ``indices`` of ``stream`` (consecutive, in order) to the safetensors file ``path``.

    The file is hashed and recorded as it is written (:mod:`.digest`; fsynced by the commit, or on close outside
    one); each tensor is dropped once written.
    """
    entries = [stream.entries[i] for i in indices]
    header = _header(entries, metadata)
    writer = digest.HashingWriter(path)
    try:
        writer.write(struct.pack("<Q", len(header)))
        writer.write(header)
        for i, entry in zip(indices, entries):
            tensor = stream.take(i)
            if tensor is None or tuple(tensor.shape) != tuple(entry.shape) or tensor.dtype != entry.dtype:
                raise RuntimeError(f"{entry.name}: the gathered tensor does not match its description "
                                   f"({None if tensor is None else (tuple(tensor.shape), tensor.dtype)} vs "
                                   f"{(entry.shape, entry.dtype)})")
            flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
            writer.write(flat.numpy())
            del tensor, flat
    except BaseException:
        writer.abort()
        path.unlink(missing_ok=True)  # never leave a file whose header promises bytes that were not written
        raise
    writer.close()


def plan_streamed_shards(entries: list[Entry], max_bytes: int) -> list[list[int]]:
    """Consecutive groups of entry indices, each at most ``max_bytes`` (one bigger tensor gets a file of its own)."""
    shards: list[list[int]] = [[]]
    current = 0
    for i, entry in enumerate(entries):
        if shards[-1] and current + entry.nbytes > max_bytes:
            shards.append([])
            current = 0
        shards[-1].append(i)
        current += entry.nbytes
    return shards


def tensor_stream(named: Iterator[tuple[str, "torch.Tensor"]], gather: Callable[[Any], "torch.Tensor | None"],
                  shape_of: Callable[[Any], tuple[int, ...]]) -> StreamedWeights:
    """A :class:`StreamedWeights` over ``named`` (``state_dict(keep_vars=True).items()``), one entry per distinct
    tensor object (tied names become aliases). ``gather(obj)``: the full tensor as a CPU copy on the writing rank,
    None on the others (a collective); ``shape_of(obj)``: its full shape, without gathering."""
    objects: list[Any] = []
    entries: list[Entry] = []
    first: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for name, obj in named:
        if id(obj) in first:
            aliases[name] = first[id(obj)]
            continue
        first[id(obj)] = name
        objects.append(obj)
        entries.append(Entry(name, obj.dtype, tuple(int(d) for d in shape_of(obj))))
    # safetensors' own layout (widest dtype first, then by name), so a streamed file holds the header and bytes
    # safetensors writes for the same tensors (byte for byte with one metadata key; safetensors orders several at
    # random); the same order on every rank (it depends on the names and dtypes only)
    order = sorted(range(len(entries)), key=lambda i: (-entries[i].dtype.itemsize, entries[i].name))
    entries = [entries[i] for i in order]
    objects = [objects[i] for i in order]
    return StreamedWeights(entries, lambda index: gather(objects[index]), aliases)
