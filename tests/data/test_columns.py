"""Column removal: forward signature columns, the removing collator, dataset-style removal, label checks."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from trainwell.data.collators import default_data_collator
from trainwell.data.columns import (
    RemoveColumnsCollator,
    check_labels_present,
    remove_unused_columns_from_dataset,
    signature_columns,
)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, input_ids, attention_mask=None, labels=None):
        return self.linear(input_ids.float())


class Wrapper(nn.Module):
    """Stands in for DDP / DataParallel: the real model is ``.module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def test_signature_columns_unwraps_and_adds_labels():
    expected = ["input_ids", "attention_mask", "labels", "label", "label_ids"]
    assert signature_columns(Net()) == expected
    assert signature_columns(Wrapper(Net())) == expected
    compiled_like = nn.Module()
    compiled_like._orig_mod = Net()
    assert signature_columns(compiled_like) == expected
    assert signature_columns(Net(), label_names=["start_positions", "labels"]) == expected + ["start_positions"]


def test_remove_columns_collator_drops_extra_keys_and_logs_once(caplog):
    collator = RemoveColumnsCollator(default_data_collator, signature_columns(Net()), model_name="Net",
                                     description="training")
    features = [{"input_ids": [1, 2], "idx": 0, "text": "a", "label": 1},
                {"input_ids": [3, 4], "idx": 1, "text": "b", "label": 0}]
    with caplog.at_level(logging.INFO, logger="trainwell.data.columns"):
        batch = collator(features)
        collator(features)
    assert set(batch) == {"input_ids", "labels"}
    messages = [r.getMessage() for r in caplog.records if "don't have a corresponding argument" in r.getMessage()]
    assert len(messages) == 1
    assert "in the training set" in messages[0] and "`Net.forward`" in messages[0] and "idx, text" in messages[0]
    assert features[0]["idx"] == 0  # the caller's examples are not modified
    passthrough = RemoveColumnsCollator(lambda xs: xs, ["input_ids"])
    assert passthrough([(1, 2), [3]]) == [(1, 2), [3]]


class FakeDataset:
    def __init__(self, columns):
        self.column_names = list(columns)
        self.removed = None

    def remove_columns(self, names):
        self.removed = list(names)
        return FakeDataset([c for c in self.column_names if c not in names])


def test_remove_unused_columns_from_dataset():
    ds = FakeDataset(["input_ids", "sentence", "label", "idx"])
    out = remove_unused_columns_from_dataset(ds, signature_columns(Net()), "evaluation")
    assert ds.removed == ["sentence", "idx"] and out.column_names == ["input_ids", "label"]
    same = FakeDataset(["input_ids"])
    assert remove_unused_columns_from_dataset(same, ["input_ids"]) is same and same.removed is None
    plain = [{"input_ids": [1], "junk": 2}]
    assert remove_unused_columns_from_dataset(plain, ["input_ids"]) is plain
    with pytest.raises(ValueError) as info:
        remove_unused_columns_from_dataset(FakeDataset(["text", "idx"]), ["input_ids", "labels"], "train")
    message = str(info.value)
    assert "['text', 'idx']" in message and "['input_ids', 'labels']" in message
    assert "remove_unused_columns=False" in message


def test_check_labels_present():
    check_labels_present({"input_ids": torch.ones(1), "labels": torch.ones(1)}, ["labels"])
    check_labels_present({"input_ids": torch.ones(1)}, [])
    with pytest.raises(ValueError, match=r"no 'labels' column \(found: input_ids, attention_mask\)"):
        check_labels_present({"input_ids": 1, "attention_mask": 1}, ["labels"])
