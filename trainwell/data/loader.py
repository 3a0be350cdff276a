"""Building ``torch.utils.data.DataLoader`` objects with the options ``TrainingArguments`` exposes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset

__all__ = ["PreparedDataLoader", "build_dataloader", "has_length", "stateful_loader_class"]


def has_length(dataset: Any) -> bool:
    """True when ``len(dataset)`` works (map-style datasets, samplers, loaders over them); False for iterables."""
    try:
        return len(dataset) is not None
    except (TypeError, NotImplementedError, AttributeError):
        return False


def _worker_options(num_workers: int, persistent_workers: bool, prefetch_factor: int | None,
                    multiprocessing_context: Any = None, in_order: bool = True) -> dict[str, Any]:
    # DataLoader rejects prefetch_factor / persistent_workers / multiprocessing_context when loading happens in the
    # main process, and in_order means nothing there (one process yields in order).
    if num_workers <= 0:
        return {}
    options: dict[str, Any] = {"persistent_workers": persistent_workers}
    if prefetch_factor is not None:
        options["prefetch_factor"] = prefetch_factor
    if multiprocessing_context is not None:
        options["multiprocessing_context"] = multiprocessing_context
    if not in_order:  # torch >= 2.6's option; left out when it is the default, so older torch keeps working
        options["in_order"] = False
    return options


class PreparedDataLoader(DataLoader):
    """A ``DataLoader`` that also answers what accelerate's prepared loaders (``DataLoaderShard``) add and upstream's
    and the libraries' code reads: ``total_batch_size`` and ``total_dataset_length``."""

    num_processes: int = 1  # the processes that each take a batch of ``batch_size`` per step

    @property
    def total_batch_size(self) -> int | None:
        """Examples per step across all processes: ``batch_size * num_processes`` (the batch sampler's batch size
        when the loader has one; None without batching)."""
        size = self.batch_size
        if size is None:
            holder = self.sampler if isinstance(self.sampler, BatchSampler) else self.batch_sampler
            size = getattr(holder, "batch_size", None)
        return None if size is None else size * self.num_processes

    @property
    def total_dataset_length(self) -> int:
        """The dataset's ``total_length`` when it has one, else ``len(dataset)``."""
        total = getattr(self.dataset, "total_length", None)
        return int(total) if total is not None else len(self.dataset)  # type: ignore[arg-type]


def stateful_loader_class() -> type | None:
    """A :class:`PreparedDataLoader` that is also torchdata's ``StatefulDataLoader`` (its ``state_dict()`` holds
    the position of an ``IterableDataset`` in every worker process); None when torchdata is not installed
    (``pip install 'trainwell[stream]'``)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return None
    return type("PreparedStatefulDataLoader", (PreparedDataLoader, StatefulDataLoader), {})


def build_dataloader(
    dataset: Any,
    *,
    batch_size: int,
    collate_fn: Callable[[list[Any]], Any] | None,
    sampler: Any = None,
    shuffle: bool = False,
    drop_last: bool = False,
    num_workers: int = 0,
    pin_memory: bool = False,
    persistent_workers: bool = False,
    prefetch_factor: int | None = None,
    worker_init_fn: Callable[[int], None] | None = None,
    generator: Any = None,
    multiprocessing_context: Any = None,
    in_order: bool = True,
    num_processes: int = 1,
    loader_class: type | None = None,
) -> Any:
    """A ``DataLoader`` over ``dataset``.

    ``prefetch_factor``, ``persistent_workers``, ``multiprocessing_context`` (a start method name or context) and
    ``in_order`` are passed only when ``num_workers > 0``. An
    ``IterableDataset`` gets neither sampler nor shuffling (it orders itself); passing a ``sampler`` with one is
    an error. ``sampler`` and ``shuffle=True`` are mutually exclusive. The loader is a :class:`PreparedDataLoader`
    whose ``total_batch_size`` counts ``num_processes`` (each taking ``batch_size`` per step), as accelerate's
    (``loader_class``: a subclass of it to build instead, e.g. :func:`stateful_loader_class`'s).
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be at least 1 (per_device_*_batch_size).")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0 (dataloader_num_workers).")
    kwargs: dict[str, Any] = dict(
        batch_size=batch_size, collate_fn=collate_fn, drop_last=drop_last, num_workers=num_workers,
        pin_memory=pin_memory, worker_init_fn=worker_init_fn, generator=generator,
    )
    kwargs.update(_worker_options(num_workers, persistent_workers, prefetch_factor, multiprocessing_context,
                                  in_order))
    if isinstance(dataset, IterableDataset):
        if sampler is not None:
            raise ValueError("sampler was given for an IterableDataset, which orders itself: pass sampler=None.")
        loader = (loader_class or PreparedDataLoader)(dataset, **kwargs)
    else:
        if sampler is not None and shuffle:
            raise ValueError("sampler and shuffle=True are mutually exclusive: shuffle inside the sampler instead.")
        loader = PreparedDataLoader(dataset, sampler=sampler, shuffle=shuffle, **kwargs)
    loader.num_processes = num_processes
    return loader


def collator_draws_randomness(dataloader: Any) -> bool | None:
    """Whether ``dataloader`` draws from the main process's random streams when it collates a batch: False with
    worker processes (they draw from their own) or no collator; otherwise what the collator declares in its
    ``deterministic`` attribute (trainwell's collators do; ``DataCollatorForLanguageModeling`` masks at random unless
    ``mlm=False``); None when it declares nothing (a user's function, another library's collator): the look-ahead
    then watches the first batches (see :class:`trainwell.loops.look_ahead.BatchLookAhead`)."""
    if getattr(dataloader, "num_workers", 0) > 0:
        return False
    collator = getattr(dataloader, "collate_fn", None)
    collator = getattr(collator, "data_collator", collator)  # RemoveColumnsCollator wraps the user's collator
    if collator is None:
        return False
    declared = getattr(collator, "deterministic", None)
    return None if declared is None else not declared
