"""Options of the training loop that touch evaluation and accounting: eval_on_start, eval_delay, tokens seen."""

from __future__ import annotations

import pytest
import torch

from trainwell import Trainer


def _eval_steps(trainer: Trainer) -> list[int]:
    return [entry["step"] for entry in trainer.state.log_history if "eval_loss" in entry]


def test_eval_on_start_evaluates_before_the_first_step(tiny, make_args):
    data = tiny.regression_data(32)
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(eval_on_start=True, eval_strategy="epoch",
                                                                   num_train_epochs=2),
                      train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    assert _eval_steps(trainer) == [0, 4, 8]


def test_eval_delay_skips_early_evaluations(tiny, make_args):
    data = tiny.regression_data(32)
    args = make_args(eval_strategy="steps", eval_steps=2, eval_delay=5, max_steps=8)
    trainer = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    assert _eval_steps(trainer) == [6, 8]


def test_num_input_tokens_seen_counts_every_micro_batch(tiny, make_args):
    data = tiny.token_data(32, seq=6)
    args = make_args(include_num_input_tokens_seen=True, num_train_epochs=1, gradient_accumulation_steps=2,
                     logging_steps=1)
    trainer = Trainer(model=tiny.TokenLM(), args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.num_input_tokens_seen == 32 * 6
    logged = [e["num_input_tokens_seen"] for e in trainer.state.log_history if "loss" in e]
    assert logged == [96, 192]


class ShufflingStream(torch.utils.data.IterableDataset):
    """An iterable dataset that shuffles with its own ``generator`` (and records each epoch's order)."""

    def __init__(self, n: int = 16) -> None:
        self.n = n
        self.generator = torch.Generator()
        self.orders: list[list[int]] = []

    def __iter__(self):
        order = torch.randperm(self.n, generator=self.generator).tolist()
        self.orders.append(order)
        for i in order:
            yield {"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))}


def test_iterable_dataset_generator_is_seeded_per_epoch(tiny, make_args):
    runs = []
    for _ in range(2):
        stream = ShufflingStream()
        args = make_args(max_steps=6, per_device_train_batch_size=8)  # 2 batches an epoch: 3 epochs
        Trainer(model=tiny.RegressionModel(), args=args, train_dataset=stream).train()
        runs.append(stream.orders)
    assert len(runs[0]) == 3
    assert runs[0] == runs[1]  # reproducible
    assert runs[0][0] != runs[0][1] != runs[0][2]  # a new order every epoch


class InfAtThirdStep(torch.nn.Module):
    """Regression whose 3rd training loss is +inf with a zero gradient (an fp16 overflow step); records the others."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.losses: list[float] = []

    def forward(self, x, labels=None):
        loss = torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)
        if self.training:
            self.losses.append(loss.item())
            if len(self.losses) == 3:
                loss = loss * 0.0 + float("inf")
        return {"loss": loss}


def test_nan_inf_filter_counts_a_bad_step_as_the_running_average(tiny, make_args):
    model = InfAtThirdStep()
    args = make_args(max_steps=4, logging_steps=4, optim="sgd", logging_nan_inf_filter=True)
    trainer = Trainer(model=model, args=args, train_dataset=tiny.regression_data(64))
    trainer.train()
    a, b, _, d = model.losses
    running = a + b
    expected = (running + running / 3 + d) / 4  # upstream: the bad step adds tr_loss / (1 + step - last_logged)
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert logged[0] == pytest.approx(expected, rel=1e-5)
