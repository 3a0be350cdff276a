"""Mistakes a user makes in the first hour, refused (or named) at ``Trainer()``, before any step runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        return {"loss": ((self.linear(x).squeeze(-1) - labels) ** 2).mean()}


def _data(n: int = 8) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(2, generator=g), "labels": 0.5} for _ in range(n)]


@pytest.fixture
def args(tmp_path):
    return TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True)


def test_the_model_class_instead_of_an_instance_says_to_pass_an_instance(args):
    with pytest.raises(TypeError, match=r"the class Regression, not a model: pass an instance.*Regression\(\.\.\.\)"):
        Trainer(model=Regression, args=args, train_dataset=_data())
    assert not Path(args.output_dir).exists()  # refused before anything was written


def test_an_empty_eval_dataset_is_refused_at_construction(args):
    with pytest.raises(ValueError, match=r"eval_dataset is empty \(0 items\)"):
        Trainer(model=Regression(), args=args, train_dataset=_data(), eval_dataset=[])
    with pytest.raises(ValueError, match=r"eval_dataset\['b'\] is empty"):
        Trainer(model=Regression(), args=args, train_dataset=_data(), eval_dataset={"a": _data(2), "b": []})


def test_a_dataset_dict_as_train_dataset_says_to_pick_a_split(args):
    datasets = pytest.importorskip("datasets")
    split = datasets.Dataset.from_dict({"x": [[1.0, 2.0]], "labels": [0.5]})
    with pytest.raises(TypeError, match=r"DatasetDict of the splits \['train', 'test'\]; pick one: "
                                        r"train_dataset=ds\['train'\]"):
        Trainer(model=Regression(), args=args, train_dataset=datasets.DatasetDict({"train": split, "test": split}))
    # as eval_dataset, a DatasetDict is upstream's dict of evaluation sets: accepted, each evaluated under its name
    trainer = Trainer(model=Regression(), args=args, train_dataset=split,
                      eval_dataset=datasets.DatasetDict({"a": split, "b": split}))
    assert set(trainer.evaluate()) >= {"eval_a_loss", "eval_b_loss"}


@pytest.mark.parametrize("given", ["eval_steps", "eval_dataset"])
def test_evaluation_settings_with_eval_strategy_no_are_named(given, tmp_path, caplog):
    extra = {"eval_steps": 5} if given == "eval_steps" else {}
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", eval_strategy="no", **extra)
    with caplog.at_level(logging.WARNING, logger="trainwell.trainer"):
        Trainer(model=Regression(), args=args, train_dataset=_data(),
                eval_dataset=_data(2) if given == "eval_dataset" else None)
    warned = [r.getMessage() for r in caplog.records if "eval_strategy is 'no'" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith(given), warned


def test_no_warning_when_evaluation_is_scheduled(tmp_path, caplog):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", eval_strategy="steps", eval_steps=2)
    with caplog.at_level(logging.WARNING, logger="trainwell.trainer"):
        Trainer(model=Regression(), args=args, train_dataset=_data(), eval_dataset=_data(2))
    assert not [r for r in caplog.records if "eval_strategy is 'no'" in r.getMessage()]


def test_get_tp_size_is_one_without_tensor_parallelism_and_reads_the_models(args):
    """TRL's SFTTrainer divides by ``get_tp_size()`` with ``average_tokens_across_devices``: it must exist."""
    model = Regression()
    trainer = Trainer(model=model, args=args, train_dataset=_data())
    assert trainer.get_tp_size() == 1
    model._tp_size = 2  # what a model loaded with a tensor-parallel plan carries
    assert trainer.get_tp_size() == 2


class TokenModel(nn.Module):
    """A tiny token classifier whose loss is the mean over the labels that are not -100 (as transformers heads)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(logits.view(-1, 10), labels.view(-1), ignore_index=-100,
                                           reduction="sum") / (labels != -100).sum().clamp(min=1)
        return {"loss": loss, "logits": logits}


def test_every_label_ignored_is_named_at_the_first_step(tmp_path, caplog):
    rows = [{"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([-100, -100, -100])} for _ in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, max_steps=2,
                             per_device_train_batch_size=4, save_strategy="no")
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        result = Trainer(model=TokenModel(), args=args, train_dataset=rows).train()
    warned = [r.getMessage() for r in caplog.records if "-100" in r.getMessage()]
    assert len(warned) == 1 and "every entry of `labels` in the first batch is -100" in warned[0]
    assert result.training_loss == 0.0  # what the run reports: the warning is why


def test_labels_with_some_entries_kept_say_nothing(tmp_path, caplog):
    rows = [{"input_ids": torch.tensor([1, 2, 3]), "labels": torch.tensor([-100, 4, -100])} for _ in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True, max_steps=2,
                             per_device_train_batch_size=4, save_strategy="no")
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        Trainer(model=TokenModel(), args=args, train_dataset=rows).train()
    assert not [r for r in caplog.records if "-100" in r.getMessage()]
