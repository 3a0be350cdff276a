"""Bad input gives a clear error: each test asserts what the message tells the user."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import IterableDataset

from trainwell import StopOnNonFiniteLossCallback, Trainer, TrainerCallback, TrainingArguments


class NoLossModel(nn.Module):
    """Returns only logits, even when given labels."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        return {"logits": self.linear(x)}


def test_model_returning_no_loss_says_what_to_return(tiny, make_args):
    trainer = Trainer(model=NoLossModel(), args=make_args(max_steps=1), train_dataset=tiny.regression_data(16))
    with pytest.raises(ValueError) as info:
        trainer.train()
    message = str(info.value)
    assert "did not return a loss" in message and "logits" in message
    assert "first element of a tuple" in message and "'loss'" in message


def test_items_without_labels_name_the_missing_column(tiny, make_args):
    data = [{"x": d["x"]} for d in tiny.regression_data(16)]
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(max_steps=1), train_dataset=data)
    with pytest.raises(ValueError, match=r"no \['labels'\] column \(batch keys: \['x'\]\)"):
        trainer.train()


def test_unknown_training_argument_is_a_type_error_naming_it(tmp_path):
    with pytest.raises(TypeError, match="learning_rat"):
        TrainingArguments(output_dir=str(tmp_path), learning_rat=0.1)


def test_fp16_with_bf16_names_both(tmp_path):
    with pytest.raises(ValueError) as info:
        TrainingArguments(output_dir=str(tmp_path), fp16=True, bf16=True)
    assert "fp16" in str(info.value) and "bf16" in str(info.value)


def test_empty_train_dataset(tiny, make_args):
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(), train_dataset=[])
    with pytest.raises(ValueError, match="train dataset is empty"):
        trainer.train()


def test_missing_train_dataset_names_the_argument(tiny, make_args):
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args())
    with pytest.raises(ValueError, match="train_dataset="):
        trainer.train()


class Stream(IterableDataset):
    """An endless stream of regression items (no length)."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        while True:
            yield from self.items


def test_iterable_dataset_needs_max_steps(tiny, make_args):
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(), train_dataset=Stream(tiny.regression_data(8)))
    with pytest.raises(ValueError, match="max_steps"):
        trainer.train()
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(max_steps=3),
                      train_dataset=Stream(tiny.regression_data(8)))
    assert trainer.train().global_step == 3


def test_neither_model_nor_model_init(make_args):
    with pytest.raises(ValueError, match="model_init"):
        Trainer(args=make_args())


def test_unknown_train_keyword(tiny, make_args):
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(), train_dataset=tiny.regression_data(8))
    with pytest.raises(TypeError, match="resume_from_chekpoint"):
        trainer.train(resume_from_chekpoint=True)


def test_gradient_checkpointing_without_blocks(tiny, make_args):
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(gradient_checkpointing=True),
                      train_dataset=tiny.regression_data(8))
    with pytest.raises(ValueError, match="gradient_checkpointing=True.*ModuleList"):
        trainer.train()


class PoisonedModel(nn.Module):
    """A regression model whose loss turns NaN from its ``poison_from``-th forward pass in training."""

    def __init__(self, poison_from: int) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.poison_from = poison_from
        self.calls = 0

    def forward(self, x, labels=None):
        if self.training:
            self.calls += 1
        loss = F.mse_loss(self.linear(x).squeeze(-1), labels)
        if self.training and self.calls >= self.poison_from:
            loss = loss * float("nan")
        return {"loss": loss}


class SnapshotOnSave(TrainerCallback):
    """Keeps a copy of the weights at every save."""

    def __init__(self) -> None:
        self.saved: dict[int, dict[str, torch.Tensor]] = {}

    def on_save(self, args, state, control, model=None, **kwargs):
        self.saved[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_nan_loss_diverges_clearly_and_last_checkpoint_still_loads(tiny, make_args):
    from safetensors.torch import load_file

    snapshots = SnapshotOnSave()
    args = make_args(max_steps=6, save_strategy="steps", save_steps=2, logging_steps=1, optim="sgd")
    trainer = Trainer(model=PoisonedModel(poison_from=3), args=args, train_dataset=tiny.regression_data(64),
                      callbacks=[snapshots, StopOnNonFiniteLossCallback()])  # stopping is opt-in
    with pytest.raises(FloatingPointError) as info:
        trainer.train()
    message = str(info.value)
    assert "diverged" in message and "step 3" in message and "checkpoint-2" in message
    assert sorted(d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")) == ["checkpoint-2"]
    folder = os.path.join(args.output_dir, "checkpoint-2")
    loaded = load_file(os.path.join(folder, "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in loaded.values())
    assert all(torch.equal(loaded[k], snapshots.saved[2][k]) for k in loaded)

    # a healthy model resumes from it and finishes
    resumed = Trainer(model=tiny.RegressionModel(), args=make_args(max_steps=4, optim="sgd"),
                      train_dataset=tiny.regression_data(64))
    result = resumed.train(resume_from_checkpoint=folder)
    assert result.global_step == 4
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


def test_unknown_argument_suggests_the_closest_field():
    from trainwell import Seq2SeqTrainingArguments, TrainingArguments

    for cls in (TrainingArguments, Seq2SeqTrainingArguments):
        with pytest.raises(TypeError, match=r"'learning_rat' \(did you mean 'learning_rate'\?\)"):
            cls(output_dir="unused", learning_rat=1e-3)
