"""Resumable, seekable samplers: the data order is a pure function of ``(seed, epoch)``.

A bit-exact resume needs the sampler to reproduce the interrupted epoch's order and to start part-way into it
without reading the skipped examples. :class:`ResumableSampler` and :class:`LengthGroupedSampler` do both:

* the order of epoch ``e`` depends only on ``seed`` and ``e`` (a fresh ``torch.Generator`` seeded with
  ``seed + e``), never on the global RNG or on how many epochs ran in this process;
* ``skip(k)`` makes the *next* iteration start ``k`` samples into this rank's order (a seek, no reads); the skip
  is consumed by that iteration and resets to 0, so the following epoch is whole again;
* ``state_dict()``/``load_state_dict()`` carry ``epoch``, ``seed`` and ``skip``.

With ``num_replicas > 1`` the full order is padded (repeating from its start) or cut (``drop_last``) to a
multiple of ``num_replicas`` and rank ``r`` takes ``order[r::num_replicas]``, exactly as
``torch.utils.data.DistributedSampler`` does, so the ranks together cover every index.

:func:`skip_first_batches` is the fallback for what cannot seek (iterable datasets, foreign samplers): it reads
and discards.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

import torch
from torch.utils.data import Sampler

logger = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = [
    "ResumableSampler",
    "LengthGroupedSampler",
    "EvalShardSampler",
    "get_length_grouped_indices",
    "infer_lengths",
    "skip_first_batches",
]


def _check_replicas(num_replicas: int, rank: int) -> None:
    if num_replicas < 1:
        raise ValueError(f"num_replicas={num_replicas} must be at least 1 (the number of processes).")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank={rank} must be in [0, num_replicas={num_replicas}); pass this process's rank.")


def per_rank_count(total: int, num_replicas: int, drop_last: bool) -> int:
    """How many samples each rank gets from ``total`` (DistributedSampler's arithmetic)."""
    if drop_last and total % num_replicas != 0:
        return max(0, math.ceil((total - num_replicas) / num_replicas))
    return math.ceil(total / num_replicas)


def per_rank_batched_count(total: int, num_replicas: int, drop_last: bool, batch_size: int) -> int:
    """How many samples each rank gets when whole batches of ``batch_size`` are dealt out in turn (accelerate's
    ``BatchSamplerShard``): ``drop_last`` keeps only complete rounds of ``num_replicas`` full batches, otherwise the
    last round is completed by repeating the order from its start."""
    round_size = batch_size * num_replicas
    rounds = total // round_size if drop_last else math.ceil(total / round_size)
    return rounds * batch_size


def partition(indices: list[int], num_replicas: int, rank: int, drop_last: bool,
              batch_size: int | None = None) -> list[int]:
    """Pad (repeating from the start) or cut ``indices`` to a multiple of ``num_replicas``; keep rank's stride.

    With ``batch_size`` the stride is one batch: rank ``r`` takes batches ``r, r + num_replicas, ...`` of the
    (padded or cut) order, as the upstream Trainer's ranks do under accelerate, so that each rank trains on the same
    examples as there (and, seeded alike, applies the same dropout masks to them).
    """
    if num_replicas == 1:
        return indices
    if batch_size is not None:
        total_size = per_rank_batched_count(len(indices), num_replicas, drop_last, batch_size) * num_replicas
        indices = _pad_or_cut(indices, total_size)
        return [i for start in range(rank * batch_size, total_size, num_replicas * batch_size)
                for i in indices[start:start + batch_size]]
    total_size = per_rank_count(len(indices), num_replicas, drop_last) * num_replicas
    return _pad_or_cut(indices, total_size)[rank:total_size:num_replicas]


def _pad_or_cut(indices: list[int], total_size: int) -> list[int]:
    """``indices`` cut to ``total_size``, or padded to it by repeating the order from its start."""
    if total_size > len(indices):
        padding = total_size - len(indices)
        repeats = math.ceil(padding / len(indices))
        return indices + (indices * repeats)[:padding]
    return indices[:total_size]


class _SeekableSampler(Sampler[int]):
    """Shared epoch/skip/state handling; subclasses implement :meth:`_full_order` for one epoch."""

    def __init__(self, total: int, *, seed: int, num_replicas: int, rank: int, drop_last: bool,
                 shard_batch_size: int | None = None) -> None:
        _check_replicas(num_replicas, rank)
        if shard_batch_size is not None and shard_batch_size < 1:
            raise ValueError(f"shard_batch_size={shard_batch_size} must be at least 1 (the per-device batch size).")
        self.shard_batch_size = shard_batch_size
        self.seed = int(seed)
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self._skip = 0
        self._total = total

    def _full_order(self) -> list[int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed + self.epoch)

    def rank_order(self) -> list[int]:
        """This rank's whole order for the current epoch (ignores any pending skip)."""
        return partition(self._full_order(), self.num_replicas, self.rank, self.drop_last, self.shard_batch_size)

    def __iter__(self) -> Iterator[int]:
        # The order is built and the skip consumed when the iterator is created (DataLoader does this once per
        # epoch), not lazily on the first ``next``.
        order = self.rank_order()
        start, self._skip = self._skip, 0
        return iter(order[start:])

    def __len__(self) -> int:
        """Samples this rank sees in a whole epoch; NOT reduced by a pending ``skip`` (see :attr:`remaining`)."""
        if self.shard_batch_size is not None and self.num_replicas > 1:
            return per_rank_batched_count(self._total, self.num_replicas, self.drop_last, self.shard_batch_size)
        return per_rank_count(self._total, self.num_replicas, self.drop_last)

    @property
    def remaining(self) -> int:
        """Samples the next iteration will yield: ``len(self)`` minus the pending skip."""
        return max(0, len(self) - self._skip)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next iteration yields."""
        self.epoch = int(epoch)

    def skip(self, num_samples_to_skip: int) -> None:
        """Start the next iteration ``num_samples_to_skip`` samples into this rank's order (seek, reads nothing).

        For a resume at batch ``b`` of the epoch, skip ``b * per_device_batch_size`` samples.
        """
        if num_samples_to_skip < 0:
            raise ValueError(f"num_samples_to_skip={num_samples_to_skip} must be >= 0.")
        self._skip = int(num_samples_to_skip)

    def state_dict(self) -> dict[str, Any]:
        """``epoch``, ``seed``, ``skip`` (and ``num_samples`` to detect a changed dataset on load)."""
        return {"epoch": self.epoch, "seed": self.seed, "skip": self._skip, "num_samples": self._total}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved; warns when the dataset size changed (the order will differ)."""
        saved_total = state.get("num_samples")
        if saved_total is not None and saved_total != self._total:
            logger.warning(
                "The sampler state was saved for %d samples but the dataset now has %d: the resumed data order "
                "will not match the interrupted run.", saved_total, self._total,
            )
        self.epoch = int(state.get("epoch", self.epoch))
        self.seed = int(state.get("seed", self.seed))
        self.skip(int(state.get("skip", 0)))


class ResumableSampler(_SeekableSampler):
    """Random (or sequential) sampler whose epoch order is ``randperm(n, seed + epoch)``; seekable and resumable.

    Args:
        num_samples: size of the dataset.
        shuffle: random order per epoch (default) or ``range(num_samples)``.
        seed: base seed; epoch ``e`` uses ``seed + e``.
        num_replicas, rank: split the order across processes like ``DistributedSampler``.
        drop_last: cut (instead of pad) the order to a multiple of ``num_replicas``.
        shard_batch_size: deal the order out in whole batches of this size instead (see :func:`partition`).
    """

    def __init__(self, num_samples: int, *, shuffle: bool = True, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0, drop_last: bool = False, shard_batch_size: int | None = None) -> None:
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples={num_samples!r} must be a non-negative int (the dataset's length).")
        super().__init__(num_samples, seed=seed, num_replicas=num_replicas, rank=rank, drop_last=drop_last,
                         shard_batch_size=shard_batch_size)
        self.num_samples = num_samples
        self.shuffle = shuffle

    def _full_order(self) -> list[int]:
        if self.shuffle:
            return torch.randperm(self.num_samples, generator=self._generator()).tolist()
        return list(range(self.num_samples))


class EvalShardSampler(Sampler[int]):
    """Sequential evaluation order split over ranks so that gathering the batches restores the dataset order.

    The dataset is read in global batches of ``batch_size * num_replicas`` samples; rank ``r`` takes the ``r``-th
    contiguous ``batch_size`` share of each, so every batch a rank evaluates is exactly one batch of a
    single-process evaluation (same samples, same order, same padding by the collator). Nothing is padded with
    duplicates: in the last global batch a rank gets only the real samples left for it (a short batch), and a rank
    with none left gets one *placeholder* batch (the last real sample, repeated to ``batch_size`` with
    ``drop_last`` so the DataLoader keeps it) so that every rank runs the same number of batches and the
    per-batch collectives cannot hang. The evaluation loop drops the placeholder: the first
    :attr:`num_real_samples` samples this rank yields (its first :attr:`num_real_batches` batches) are real, the
    rest are not.

    With ``drop_last`` the samples of a single process's incomplete last batch (``num_samples % batch_size``)
    are left out on every rank, as one process leaves them out.

    Args:
        num_samples: the dataset's length.
        batch_size: the per-device evaluation batch size (the DataLoader's ``batch_size``).
        num_replicas, rank: the number of processes and this one's rank.
        drop_last: whether the DataLoader drops incomplete batches (``dataloader_drop_last``).
        order: the single-process evaluation order, a permutation of the dataset's indices (default: the dataset's
            order); ``group_by_length`` evaluates in a length-grouped one. Rank ``r`` takes its shares of it.
    """

    def __init__(self, num_samples: int, *, batch_size: int, num_replicas: int, rank: int,
                 drop_last: bool = False, order: Sequence[int] | None = None) -> None:
        _check_replicas(num_replicas, rank)
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1 (per_device_eval_batch_size).")
        if not isinstance(num_samples, int) or num_samples < 0:
            raise ValueError(f"num_samples={num_samples!r} must be a non-negative int (the dataset's length).")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        if order is not None and len(order) != num_samples:
            raise ValueError(f"order has {len(order)} indices for num_samples={num_samples}: pass a permutation of "
                             f"the dataset's indices.")
        self.order = order
        # What one process evaluates: everything, or only whole batches with drop_last.
        self._evaluated = (num_samples // batch_size) * batch_size if drop_last else num_samples

    @property
    def num_batches(self) -> int:
        """Batches every rank runs (the number of global batches)."""
        return math.ceil(self._evaluated / (self.batch_size * self.num_replicas))

    def _real_in_batch(self, batch: int) -> int:
        start = batch * self.batch_size * self.num_replicas + self.rank * self.batch_size
        return min(max(self._evaluated - start, 0), self.batch_size)

    @property
    def num_real_samples(self) -> int:
        """Samples of the dataset this rank evaluates (the first ones it yields); the rest is a placeholder."""
        return sum(self._real_in_batch(b) for b in range(self.num_batches))

    @property
    def num_real_batches(self) -> int:
        """Batches of this rank that hold dataset samples (the first ones); a batch after them is a placeholder.

        A batch is wholly real or wholly a placeholder, so the evaluation loop keeps or drops whole batches: it
        never counts a batch's rows, which a collator may multiply (chosen and rejected rows of one sample).
        """
        return sum(1 for b in range(self.num_batches) if self._real_in_batch(b))

    @property
    def _placeholder_size(self) -> int:
        return self.batch_size if self.drop_last else 1

    def __len__(self) -> int:
        """Indices this rank yields (a placeholder batch included)."""
        return sum(self._real_in_batch(b) or self._placeholder_size for b in range(self.num_batches))

    def __iter__(self) -> Iterator[int]:
        positions = self._positions()
        return iter(positions if self.order is None else [self.order[i] for i in positions])

    def _positions(self) -> Iterator[int]:
        """This rank's positions in the single-process order."""
        global_batch = self.batch_size * self.num_replicas
        for batch in range(self.num_batches):
            start = batch * global_batch + self.rank * self.batch_size
            real = self._real_in_batch(batch)
            if real:
                yield from range(start, start + real)
            else:
                yield from [self._evaluated - 1] * self._placeholder_size


def get_length_grouped_indices(lengths: Sequence[int], batch_size: int, mega_batch_mult: int | None = None,
                               generator: torch.Generator | None = None) -> list[int]:
    """Random order in which neighbours have similar lengths (upstream's algorithm).

    The random permutation is cut into mega-batches of ``mega_batch_mult * batch_size`` (by default
    ``min(len // (4 * batch_size), 50)``, at least 1); each is sorted by decreasing length, and the longest
    element overall is moved to the very front so that an out-of-memory error shows up on the first batch.
    """
    if mega_batch_mult is None:
        mega_batch_mult = max(1, min(len(lengths) // (batch_size * 4), 50))
    indices = torch.randperm(len(lengths), generator=generator).tolist()
    size = mega_batch_mult * batch_size
    megabatches = [sorted(indices[i:i + size], key=lambda j: lengths[j], reverse=True)
                   for i in range(0, len(indices), size)]
    if not megabatches:
        return []
    longest = max(range(len(megabatches)), key=lambda m: lengths[megabatches[m][0]])
    megabatches[0][0], megabatches[longest][0] = megabatches[longest][0], megabatches[0][0]
    return [i for megabatch in megabatches for i in megabatch]


class LengthGroupedSampler(_SeekableSampler):
    """Sampler grouping examples of similar length (``group_by_length``), seekable and resumable.

    Upstream's signature first: ``LengthGroupedSampler(batch_size, dataset=None, lengths=None,
    model_input_name=None, generator=None)``; then trainwell's keyword-only options.

    Args:
        batch_size: the per-device batch size (times the accumulation steps, as the Trainer passes it).
        dataset: read for the lengths when ``lengths`` is None: ``len(example[model_input_name])`` per example.
        lengths: the length of every example (a list or a tensor).
        model_input_name: the key measured in ``dataset``'s examples (default ``"input_ids"``).
        generator: draw every epoch's order from this generator, advancing it, as upstream does (then ``seed``
            and the epoch are not used, and the order is not seekable across a resume).
        seed: base seed when no ``generator`` is given; epoch ``e`` uses ``seed + e``.
        mega_batch_mult: mega-batch size in batches (default: see :func:`get_length_grouped_indices`).
        num_replicas, rank, drop_last, shard_batch_size: split across processes like :class:`ResumableSampler`.
    """

    def __init__(self, batch_size: int, dataset: Any = None, lengths: Sequence[int] | None = None,
                 model_input_name: str | None = None, generator: torch.Generator | None = None, *, seed: int = 0,
                 mega_batch_mult: int | None = None, num_replicas: int = 1, rank: int = 0,
                 drop_last: bool = False, shard_batch_size: int | None = None) -> None:
        if not isinstance(batch_size, int):
            raise TypeError(f"LengthGroupedSampler takes the batch size first (upstream's signature), got "
                            f"{type(batch_size).__name__}: call LengthGroupedSampler(batch_size, lengths=lengths).")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be at least 1.")
        if lengths is None:
            if dataset is None:
                raise ValueError("LengthGroupedSampler needs dataset= or lengths= (one of them) to group by length.")
            lengths = infer_lengths(dataset, model_input_name or "input_ids", length_column_name=None)
        elif isinstance(lengths, torch.Tensor):
            lengths = lengths.tolist()
        self.lengths = [int(n) for n in lengths]
        super().__init__(len(self.lengths), seed=seed, num_replicas=num_replicas, rank=rank, drop_last=drop_last,
                         shard_batch_size=shard_batch_size)
        self.batch_size = batch_size
        self.mega_batch_mult = mega_batch_mult
        self.generator = generator

    def _generator(self) -> torch.Generator:
        return self.generator if self.generator is not None else super()._generator()

    def _full_order(self) -> list[int]:
        return get_length_grouped_indices(self.lengths, self.batch_size, self.mega_batch_mult, self._generator())


def infer_lengths(dataset: Any, model_input_name: str = "input_ids",
                  length_column_name: str | None = "length") -> list[int]:
    """Example lengths for :class:`LengthGroupedSampler`.

    Reads the precomputed ``length_column_name`` column (None: none) of a ``datasets.Dataset`` when it has one, else
    ``len(example[model_input_name])`` for every example.
    """
    columns = getattr(dataset, "column_names", None)
    if isinstance(columns, list) and length_column_name in columns:
        return [int(n) for n in dataset[length_column_name]]
    lengths = []
    for i in range(len(dataset)):
        example = dataset[i]
        try:
            lengths.append(len(example[model_input_name]))
        except (KeyError, TypeError, IndexError) as err:
            raise ValueError(
                f"Can only infer lengths for datasets whose items are dictionaries with a {model_input_name!r} "
                f"key (item {i} is not): add a {length_column_name!r} column or set model_input_name."
            ) from err
    return lengths


def skip_first_batches(iterable: Iterable[T], num_batches: int) -> Iterator[T]:
    """Yield ``iterable``'s items after reading and discarding the first ``num_batches``.

    The fallback for what cannot seek (an ``IterableDataset``'s loader, a user's sampler): it costs the time of
    loading the skipped batches. Prefer ``sampler.skip(...)`` with the samplers of this module.
    """
    if num_batches < 0:
        raise ValueError(f"num_batches={num_batches} must be >= 0.")
    iterator = iter(iterable)
    for _ in itertools.islice(iterator, num_batches):
        pass
    yield from iterator


class EpochSeededRandomSampler(torch.utils.data.RandomSampler):
    """A ``RandomSampler`` whose order is a function of its seed and the epoch, not of how far its generator ran.

    What ``accelerator.prepare`` makes of a hand-built loader's random sampler upstream (``use_seedable_sampler``, the
    default): each pass reseeds the sampler's generator with ``initial_seed + epoch``, so epoch ``e`` draws the same
    order whatever was drawn before it (a resumed run, another process). ``initial_seed`` is torch's global initial
    seed when the sampler is made (the Trainer's ``seed``), as upstream's.
    """

    def __init__(self, sampler: torch.utils.data.RandomSampler) -> None:
        generator = sampler.generator if sampler.generator is not None else torch.Generator()
        super().__init__(sampler.data_source, replacement=sampler.replacement, num_samples=sampler._num_samples,
                         generator=generator)
        self.initial_seed = torch.random.initial_seed()
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order the next pass draws."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.epoch += 1  # a loop that never calls set_epoch still gets a new order each pass, as upstream's
