"""What ``accelerator.prepare`` does to a data loader that a library or a script built itself.

Upstream's Trainer passes every loader through accelerate's ``prepare`` (its own and the ones libraries build:
sentence-transformers' ``get_train_dataloader``, TRL's samplers behind ``_get_dataloader``); trainwell's own loaders
are sharded by its own samplers. The functions here give a loader built elsewhere what accelerate gives it.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .loader import PreparedDataLoader
from .samplers import EpochSeededRandomSampler

logger = logging.getLogger(__name__)

__all__ = ["is_sharded", "seed_random_sampler_by_epoch", "shard_dataloader"]


def seed_random_sampler_by_epoch(loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
    """``loader`` with its ``RandomSampler`` (its own, or its batch sampler's) made epoch-seeded, in place."""
    holder: Any = loader.sampler  # a BatchSampler given as the sampler, else the batch sampler (which may have one)
    if not isinstance(holder, torch.utils.data.BatchSampler):
        holder = loader.batch_sampler
    sampler = getattr(holder, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler) and not isinstance(sampler, EpochSeededRandomSampler):
        holder.sampler = EpochSeededRandomSampler(sampler)
    return loader


def _batch_sampler_shard() -> type:
    """accelerate's ``BatchSamplerShard`` (imported here: accelerate is optional)."""
    try:
        from accelerate.data_loader import BatchSamplerShard
    except ImportError as error:
        raise ImportError(
            "A data loader built outside trainwell (accelerator.prepare(loader), or a sampler returned by an override "
            "of _get_train_sampler / _get_eval_sampler) is split across processes with accelerate's "
            "BatchSamplerShard, as upstream's Trainer splits it: pip install accelerate (or 'trainwell[transformers]'), "
            "or give the loader a sampler that shards itself (torch's DistributedSampler)") from error
    return BatchSamplerShard


def is_sharded(batch_sampler: Any) -> bool:
    """Whether ``batch_sampler`` (or its sampler) already deals out a share per process: accelerate's
    ``BatchSamplerShard``, or a sampler with ``num_replicas > 1`` (torch's ``DistributedSampler``, trainwell's)."""
    if type(batch_sampler).__name__ == "BatchSamplerShard" or getattr(batch_sampler, "num_replicas", 1) > 1:
        return True
    return getattr(getattr(batch_sampler, "sampler", None), "num_replicas", 1) > 1


def shard_dataloader(loader: torch.utils.data.DataLoader, *, num_processes: int, process_index: int,
                     even_batches: bool = True) -> torch.utils.data.DataLoader:
    """``loader`` split across ``num_processes`` as accelerate's ``prepare_data_loader`` splits it for the upstream
    Trainer (whole batches, ``split_batches=False``): its batch sampler behind a ``BatchSamplerShard``, process ``i``
    taking batches ``i, i + num_processes, ...``. With ``even_batches`` (accelerate's default; upstream's Trainer
    and sentence-transformers' evaluation) the last round is completed with batches from the start so every process
    runs as many full batches; without (sentence-transformers' training) the short last batch stays where it falls.

    Returned unchanged: one process, a loader already sharded (:func:`is_sharded`), and an iterable dataset (which
    accelerate dispatches from the main process; trainwell does not: a warning says so). The new loader is a
    :class:`~trainwell.data.loader.PreparedDataLoader` with the same workers, collator and options.
    """
    if num_processes <= 1:
        return loader
    sampler_is_batch_sampler = isinstance(loader.sampler, torch.utils.data.BatchSampler)
    batch_sampler = loader.sampler if sampler_is_batch_sampler else loader.batch_sampler
    if isinstance(loader.dataset, torch.utils.data.IterableDataset) or batch_sampler is None:
        logger.warning("A data loader over %s is not split across the %d processes (accelerate would send the main "
                       "process's batches to the others): every process reads all of it",
                       type(loader.dataset).__name__, num_processes)
        return loader
    if is_sharded(batch_sampler):
        return loader
    shard = _batch_sampler_shard()(batch_sampler, num_processes=num_processes, process_index=process_index,
                                   split_batches=False, even_batches=even_batches)
    options: dict[str, Any] = {name: getattr(loader, name) for name in _LOADER_OPTIONS if hasattr(loader, name)}
    if loader.num_workers == 0:  # DataLoader refuses these without worker processes
        for name in ("prefetch_factor", "persistent_workers", "multiprocessing_context"):
            options.pop(name, None)
    if sampler_is_batch_sampler:  # DataLoader(dataset, sampler=BatchSampler(...), batch_size=None)
        sharded = PreparedDataLoader(loader.dataset, sampler=shard, batch_size=loader.batch_size, **options)
    else:
        sharded = PreparedDataLoader(loader.dataset, batch_sampler=shard, **options)
    sharded.num_processes = num_processes
    return sharded


#: the DataLoader options a sharded loader keeps (accelerate's list, less those the batch sampler replaces)
_LOADER_OPTIONS = ("num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
                   "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order")
