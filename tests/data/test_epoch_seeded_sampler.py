"""A hand-built loader passed through ``trainer.accelerator.prepare`` draws upstream's order: its random sampler is
reseeded with ``seed + epoch`` each epoch (accelerate's ``use_seedable_sampler``, upstream's default), which is what
sentence-transformers' second epoch depends on (tests/ecosystem/test_sentence_transformers.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from trainwell.data.samplers import EpochSeededRandomSampler


def _orders(sampler, epochs: int) -> list[list[int]]:
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_each_epoch_is_a_function_of_seed_and_epoch_only():
    torch.manual_seed(7)
    first = EpochSeededRandomSampler(RandomSampler(range(10), generator=torch.Generator()))
    torch.manual_seed(7)
    second = EpochSeededRandomSampler(RandomSampler(range(10), generator=torch.Generator()))
    list(second)  # an extra pass drawn first does not change what epoch 1 draws
    orders = _orders(first, 3)
    assert _orders(second, 3) == orders
    assert orders[0] != orders[1] and sorted(orders[1]) == list(range(10))
    g = torch.Generator().manual_seed(7 + 1)
    assert orders[1] == torch.randperm(10, generator=g).tolist()  # epoch 1: the order of seed + 1


def test_it_draws_what_accelerates_seedable_sampler_draws():
    accelerate = pytest.importorskip("accelerate.data_loader")
    torch.manual_seed(3)
    ours = EpochSeededRandomSampler(RandomSampler(range(12), generator=torch.Generator()))
    torch.manual_seed(3)
    theirs = accelerate.SeedableRandomSampler(data_source=range(12), generator=torch.Generator())
    assert _orders(ours, 3) == _orders(theirs, 3)


def test_prepare_makes_a_loaders_random_sampler_epoch_seeded(tmp_path):
    from helpers import RegressionModel, regression_data
    from trainwell import Trainer, TrainingArguments

    trainer = Trainer(model=RegressionModel(), args=TrainingArguments(output_dir=str(tmp_path), report_to="none"),
                      train_dataset=regression_data(8))
    batches = BatchSampler(RandomSampler(range(8), generator=torch.Generator()), batch_size=4, drop_last=False)
    loader = trainer.accelerator.prepare(DataLoader(range(8), batch_sampler=batches))
    assert isinstance(loader.batch_sampler.sampler, EpochSeededRandomSampler)
    plain = trainer.accelerator.prepare(DataLoader(range(8), batch_size=4))  # sequential: left as it is
    assert type(plain.sampler).__name__ == "SequentialSampler"
