"""What ``accelerator.prepare`` does to a data loader that a library or a script built itself.

Upstream's Trainer passes every loader through accelerate's ``prepare`` (its own and the ones libraries build:
sentence-transformers' ``get_train_dataloader``, TRL's samplers behind ``_get_dataloader``); trainwell's own loaders
are sharded by its own samplers. The functions here give a loader built elsewhere what accelerate gives it.
"""

from __future__ import annotations

from typing import Any

import torch

from .samplers import EpochSeededRandomSampler

__all__ = ["seed_random_sampler_by_epoch"]


def seed_random_sampler_by_epoch(loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
    """``loader`` with its ``RandomSampler`` (its own, or its batch sampler's) made epoch-seeded, in place."""
    holder: Any = loader.sampler  # a BatchSampler given as the sampler, else the batch sampler (which may have one)
    if not isinstance(holder, torch.utils.data.BatchSampler):
        holder = loader.batch_sampler
    sampler = getattr(holder, "sampler", None)
    if isinstance(sampler, torch.utils.data.RandomSampler) and not isinstance(sampler, EpochSeededRandomSampler):
        holder.sampler = EpochSeededRandomSampler(sampler)
    return loader
