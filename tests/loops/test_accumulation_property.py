"""Gradient accumulation is exact for any shape: B x ga micro-batches give the update of one batch of B*ga
(token-mean loss normalised by ``num_items_in_batch``; uneven -100 masks; a dataset length that leaves a short last
accumulation group)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from trainwell import Trainer, TrainingArguments


class TokenMeanLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(9, 5)
        self.head = nn.Linear(5, 9)

    def forward(self, input_ids, labels=None, num_items_in_batch=None):
        logits = self.head(self.embed(input_ids))
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return (total / (num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()), logits)


def _data(n: int, seq: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 9, (n, seq), generator=g)
    labels = torch.randint(0, 9, (n, seq), generator=g)
    for i in range(n):
        labels[i, : int(torch.randint(0, seq, (1,), generator=g))] = -100
    return [{"input_ids": ids[i], "labels": labels[i]} for i in range(n)]


def _train(tmp: str, data, batch: int, ga: int, epochs: int) -> dict[str, torch.Tensor]:
    args = TrainingArguments(output_dir=tmp, per_device_train_batch_size=batch, gradient_accumulation_steps=ga,
                             num_train_epochs=epochs, optim="sgd", learning_rate=0.5, max_grad_norm=0.0,
                             lr_scheduler_type="constant", save_strategy="no", report_to="none", disable_tqdm=True,
                             seed=1)
    trainer = Trainer(model=TokenMeanLM(), args=args, train_dataset=data)
    trainer.train()
    return trainer.model.state_dict()


@settings(max_examples=10, deadline=None, derandomize=True)
@given(n=st.integers(5, 24), micro=st.integers(1, 4), ga=st.integers(2, 4), epochs=st.integers(1, 2),
       seed=st.integers(0, 5))
@pytest.mark.slow  # over a second
def test_accumulated_micro_batches_equal_one_big_batch(tmp_path_factory, n, micro, ga, epochs, seed):
    data = _data(n, seq=4, seed=seed)
    if any(int(item["labels"].ne(-100).sum()) == 0 for item in data):
        data = [{**item, "labels": item["input_ids"]} for item in data]  # every row has at least one target
    accumulated = _train(str(tmp_path_factory.mktemp("acc")), data, micro, ga, epochs)
    big = _train(str(tmp_path_factory.mktemp("big")), data, micro * ga, 1, epochs)
    for name, value in big.items():
        torch.testing.assert_close(accumulated[name], value, rtol=1e-5, atol=1e-6, msg=name)
