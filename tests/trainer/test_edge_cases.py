"""Edge cases of the training loop, resume and logging found by review (each was a bug before its fix)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainwell import StopOnNonFiniteLossCallback, Trainer


def _steps_logged(trainer: Trainer) -> list[tuple[int, float]]:
    return [(e["step"], e["epoch"]) for e in trainer.state.log_history if "loss" in e]


def test_resume_with_a_different_batch_size_continues_from_the_global_step(tiny, make_args, caplog):
    # 64 items, batch 8: 8 steps per epoch; checkpoint-6 sits 6 batches into epoch 0.
    first = Trainer(tiny.RegressionModel(), make_args(num_train_epochs=1, save_strategy="steps", save_steps=6),
                    train_dataset=tiny.regression_data(64))
    first.train()
    folder = first.args.output_dir + "/checkpoint-6"
    # batch 16: 4 steps per epoch, 8 in all; step 6 is 2 steps into epoch 1 (the saved batch count would skip
    # all of epoch 0 and leave only 2 steps in epoch 1, ending at epoch 1.5).
    args = make_args(num_train_epochs=2, per_device_train_batch_size=16, logging_steps=1)
    resumed = Trainer(tiny.RegressionModel(), args, train_dataset=tiny.regression_data(64))
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        result = resumed.train(resume_from_checkpoint=folder)
    assert result.global_step == 8
    assert _steps_logged(resumed) == [(7, 1.75), (8, 2.0)]
    assert "train_batch_size" in caplog.text


def test_resume_with_a_shorter_dataset_derives_the_position(tiny, make_args, caplog):
    first = Trainer(tiny.RegressionModel(), make_args(max_steps=6, save_strategy="steps", save_steps=6),
                    train_dataset=tiny.regression_data(64))
    first.train()
    # 32 items: 4 steps per epoch; the saved "6 batches into epoch 0" does not exist any more.
    args = make_args(num_train_epochs=3, logging_steps=1)
    resumed = Trainer(tiny.RegressionModel(), args, train_dataset=tiny.regression_data(32))
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        result = resumed.train(resume_from_checkpoint=first.args.output_dir + "/checkpoint-6")
    assert result.global_step == 12
    assert _steps_logged(resumed)[0] == (7, 1.75)
    assert "batches per epoch" in caplog.text


class InfOnceModel(nn.Module):
    """Regression whose loss is +inf (no gradient) on its 3rd training forward, as an fp16 overflow step would be."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.calls = 0

    def forward(self, x, labels=None):
        loss = F.mse_loss(self.linear(x).squeeze(-1), labels)
        if self.training:
            self.calls += 1
            if self.calls == 3:
                loss = loss * 0.0 + float("inf")  # a zero gradient: the weights stay finite
        return {"loss": loss}


@pytest.mark.parametrize("nan_filter", [True, False])
def test_logging_nan_inf_filter_replaces_a_non_finite_step_loss(tiny, make_args, nan_filter):
    args = make_args(max_steps=4, logging_steps=4, optim="sgd", logging_nan_inf_filter=nan_filter)
    trainer = Trainer(InfOnceModel(), args, train_dataset=tiny.regression_data(64))
    result = trainer.train()
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert math.isfinite(logged[0]) == nan_filter
    assert math.isfinite(result.training_loss) == nan_filter
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_nan_weights_still_stop_training_with_the_filter_on(tiny, make_args):
    from test_trainer_errors import PoisonedModel

    args = make_args(max_steps=6, logging_steps=2, save_strategy="steps", save_steps=3, optim="sgd",
                     logging_nan_inf_filter=True)
    trainer = Trainer(PoisonedModel(poison_from=3), args, train_dataset=tiny.regression_data(64),
                      callbacks=[StopOnNonFiniteLossCallback()])  # stopping is opt-in (upstream trains on)
    with pytest.raises(FloatingPointError, match="diverged.*NaN/inf at step"):
        trainer.train()
    assert not list(Path(args.output_dir).glob("checkpoint-*"))  # the NaN weights of step 3 were not saved
