"""Outputs accumulated over the batches (and ranks) of an evaluation: padded, concatenated once, as numpy.

The gathering path scales linearly with the number of batches: each batch's outputs are kept as a separate
piece (CPU tensors are turned into numpy at once; accelerator tensors every ``eval_accumulation_steps`` steps
or at the end), and every output is padded and concatenated exactly once, at the end, into one preallocated
array. Pieces are released while the final array is filled, so the peak memory stays close to the size of
the result. Outputs whose sequence lengths differ between batches are padded on the right with ``-100``
(trailing dimensions, dim 1 being the sequence dimension).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .nested import _flatten, _unflatten, nested_detach

PAD_INDEX = -100


def _leaf_to_numpy(leaf: Any) -> Any:
    """One output leaf as a CPU numpy array (bfloat16 and other types numpy lacks become float32)."""
    if leaf is None:
        return None
    if not isinstance(leaf, torch.Tensor):
        return np.asarray(leaf)
    tensor = leaf.detach()
    if tensor.dtype == torch.bfloat16 or (tensor.is_floating_point() and tensor.element_size() == 1):
        tensor = tensor.float()  # numpy has no bfloat16 / float8
    if tensor.device.type == "cpu":
        # Copy: a model may return views of a buffer it reuses, and a copy keeps only the slice alive.
        return tensor.numpy().copy()
    return tensor.cpu().numpy()


def find_batch_size(inputs: Any) -> int | None:
    """The size of the first dimension of the first tensor found in a (nested) batch, or None."""
    leaves, _ = _flatten(inputs)
    for leaf in leaves:
        if isinstance(leaf, (torch.Tensor, np.ndarray)) and leaf.ndim > 0:
            return int(leaf.shape[0])
    return None


# --------------------------------------------------------------------------------------------------------------
# Padding and concatenation, done once
# --------------------------------------------------------------------------------------------------------------


def pad_and_concatenate(pieces: list[Any], pad_index: int = PAD_INDEX) -> np.ndarray | None:
    """Concatenate numpy arrays along dim 0, padding the trailing dims on the right with ``pad_index``.

    The result is allocated once; ``pieces`` is consumed (its entries are set to None as they are copied, so
    their memory can be released while the result fills up). Every row of every piece is kept.
    """
    if all(piece is None for piece in pieces):
        return None
    if any(piece is None for piece in pieces):
        raise ValueError("An output is None for some batches and not for others; it cannot be concatenated. "
                         "Make the model return the same outputs for every batch (or list it in ignore_keys).")
    pieces[:] = [np.atleast_1d(piece) for piece in pieces]
    ndims = {piece.ndim for piece in pieces}
    if len(ndims) != 1:
        raise ValueError(f"Cannot concatenate outputs with different numbers of dimensions {sorted(ndims)}; "
                         "make every batch return tensors of the same rank.")
    trailing = tuple(max(piece.shape[d] for piece in pieces) for d in range(1, pieces[0].ndim))
    ragged = any(piece.shape[1:] != trailing for piece in pieces)
    dtype = np.result_type(*(piece.dtype for piece in pieces))
    if ragged and dtype.kind in "bu":
        dtype = np.dtype(np.int64)  # -100 must be representable
    rows = sum(piece.shape[0] for piece in pieces)
    # np.empty leaves pages untouched until written, so the result's memory grows as the pieces are freed.
    out = np.empty((rows,) + trailing, dtype=dtype)
    offset = 0
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], None
        count = piece.shape[0]
        target = out[offset:offset + count]
        if piece.shape[1:] != trailing:
            target.fill(pad_index)
            target = target[(slice(None),) + tuple(slice(0, size) for size in piece.shape[1:])]
        target[...] = piece
        offset += count
    return out


_SLAB_MIN, _SLAB_MAX = 2**20, 64 * 2**20


class _SlabStore:
    """Append-only copies of one output leaf, packed into anonymous memory maps (slabs).

    Per-batch copies made with ``malloc`` land on the heap, whose freed memory is rarely returned to the OS;
    a slab is its own mapping, unmapped as soon as the last view into it is dropped. So while the final array
    fills up and the pieces are dropped in order, the process does not hold both in full. Slabs grow with the
    data (1/8 of what is stored so far, 1 to 64 MiB), which bounds both the waste and the number of mappings.
    """

    def __init__(self) -> None:
        self._slab: np.ndarray | None = None
        self._used = 0
        self._stored = 0

    def _new_slab(self, nbytes: int) -> np.ndarray:
        import mmap

        size = max(nbytes, min(_SLAB_MAX, max(_SLAB_MIN, self._stored // 8)))
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self._slab, self._used = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8), 0
        return self._slab

    def _reserve(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        slab = self._slab
        if slab is None or self._used + nbytes > slab.nbytes:
            slab = self._new_slab(nbytes)
        view = slab[self._used:self._used + nbytes].view(dtype).reshape(shape)
        self._used += -(-nbytes // 64) * 64  # keep every piece 64-byte aligned
        self._stored += nbytes
        return view

    def copy_in(self, leaf: Any) -> Any:
        """A numpy copy of ``leaf`` (a tensor on any device, or an array) living in the current slab."""
        if isinstance(leaf, torch.Tensor):
            tensor = leaf.detach()
            if tensor.dtype == torch.bfloat16 or (tensor.is_floating_point() and tensor.element_size() == 1):
                tensor = tensor.float()  # numpy has no bfloat16 / float8
            view = self._reserve(_numpy_dtype(tensor.dtype), tuple(tensor.shape))
            torch.from_numpy(view).copy_(tensor)  # one device-to-host copy, straight into the slab
            return view
        source = np.asarray(leaf)
        if source.dtype == object:
            return source.copy()
        view = self._reserve(source.dtype, source.shape)
        view[...] = source
        return view


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


class OutputAccumulator:
    """Collects one kind of output (losses, predictions, labels or inputs) over the batches of a loop.

    ``add`` keeps each batch's nested tensors as a piece (CPU ones are copied to numpy at once, accelerator ones
    stay on the device until ``flush``); ``result`` pads and concatenates every leaf once, or returns the list
    of per-batch structures when ``concat`` is False.
    """

    def __init__(self, concat: bool = True, pad_index: int = PAD_INDEX) -> None:
        self.concat = concat
        self.pad_index = pad_index
        self._device: list[Any] = []
        self._host: list[Any] = []
        self._stores: list[_SlabStore] = []

    @property
    def pending(self) -> int:
        """How many added pieces are still on the accelerator (moved to CPU numpy by the next ``flush``)."""
        return len(self._device)

    def add(self, nested: Any) -> None:
        """Keep one batch's output (None is ignored)."""
        if nested is None:
            return
        leaves, spec = _flatten(nested)
        if all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in leaves):
            self._host.append(self._to_host(leaves, spec))
        else:
            self._device.append(nested_detach(nested))

    def _to_host(self, leaves: list[Any], spec: Any) -> Any:
        if not self.concat:
            return _unflatten(spec, [_leaf_to_numpy(leaf) for leaf in leaves])
        while len(self._stores) < len(leaves):
            self._stores.append(_SlabStore())
        return _unflatten(spec, [None if leaf is None else store.copy_in(leaf)
                                 for store, leaf in zip(self._stores, leaves)])

    def flush(self) -> None:
        """Move the pieces still on the accelerator to CPU numpy arrays."""
        device, self._device = self._device, []
        for i in range(len(device)):
            piece, device[i] = device[i], None  # release each device piece as soon as it is copied
            self._host.append(self._to_host(*_flatten(piece)))

    def result(self) -> Any:
        """All pieces as one nested structure of numpy arrays (or a list of batches); None when nothing was added.

        Every row added is kept: the rows of a batch are not samples (a preference collator puts a sample's chosen
        and rejected sequences in two rows), so nothing here is cut by counting rows; placeholders are dropped by
        the loop before they are added.
        """
        self.flush()
        pieces, self._host, self._stores = self._host, [], []
        if not pieces:
            return None
        if not self.concat:
            return pieces
        _, spec = _flatten(pieces[0])
        columns: list[list[Any]] = []
        for i in range(len(pieces)):
            (leaves, piece_spec), pieces[i] = _flatten(pieces[i]), None
            if piece_spec != spec:
                raise ValueError("The model's outputs changed structure between batches; every batch must return "
                                 "the same tuple/dict layout to be concatenated (or set eval_do_concat_batches=False).")
            if not columns:
                columns = [[] for _ in leaves]
            for column, leaf in zip(columns, leaves):
                column.append(leaf)
        return _unflatten(spec, [pad_and_concatenate(column, self.pad_index) for column in columns])
