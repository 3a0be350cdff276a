"""Overrides written with the seeds' (older upstream) signatures work unchanged.

Each test is a user's script: a Trainer subclass with ``compute_loss(self, model, inputs, return_outputs=False)``
(all three Trainer seeds), ``training_step(self, model, inputs)`` or ``create_scheduler(self,
num_training_steps)`` (seed 002). Where transformers is installed, the same script with the current signatures
runs on ``transformers.Trainer`` and both give the same numbers. (The current upstream itself fails on the old
signatures: it passes ``num_items_in_batch`` to each.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import trainwell
from trainwell.utils.overrides import accepts, call_override
from helpers.models import SeededRegressor

N, DIM = 13, 3  # an odd length: the last batch of 4 holds one row


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = N) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.3

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def _l1(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The seeds' custom loss pattern: labels popped, the loss computed from the model's outputs."""
    labels = inputs.pop("labels")
    outputs = model(**inputs)
    return F.l1_loss(outputs["logits"], labels), outputs


def _args(lib, tmp_path, **kw):
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  learning_rate=0.1, num_train_epochs=2, report_to="none", use_cpu=True, save_strategy="no",
                  logging_steps=1, disable_tqdm=True, seed=7)
    common.update(kw)
    return lib.TrainingArguments(**common)


def _old_compute_loss_trainer(lib):
    class OldLossTrainer(lib.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False):  # exactly as the seeds show it
            loss, outputs = _l1(model, inputs)
            return (loss, outputs) if return_outputs else loss

    return OldLossTrainer


def _new_compute_loss_trainer(lib):
    class NewLossTrainer(lib.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = _l1(model, inputs)
            return (loss, outputs) if return_outputs else loss

    return NewLossTrainer


def _metrics(out: dict[str, float]) -> dict[str, float]:
    """The metrics both libraries compute (upstream adds a model preparation time, and an epoch of 0)."""
    return {k: v for k, v in out.items() if not k.endswith(("_runtime", "_per_second", "_time")) and k != "epoch"}


def test_old_compute_loss_in_train_evaluate_and_predict(tmp_path):
    trainer = _old_compute_loss_trainer(trainwell)(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path),
                                                   train_dataset=Rows(), eval_dataset=Rows(7))
    before = trainer.evaluate()
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before["eval_loss"]
    pred = trainer.predict(Rows(7))
    assert pred.predictions.shape == (7,)
    # the logged loss is the override's L1 loss, not the model's MSE
    x, y = Rows(7).x, Rows(7).y
    with torch.no_grad():
        expected = (trainer.model(x)["logits"] - y).abs().mean().item()
    assert pred.metrics["test_loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow  # over a second
def test_old_compute_loss_same_metrics_as_upstream(tmp_path):
    transformers = pytest.importorskip("transformers")
    ours = _old_compute_loss_trainer(trainwell)(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path / "a"),
                                                train_dataset=Rows(), eval_dataset=Rows(7))
    theirs = _new_compute_loss_trainer(transformers)(model=SeededRegressor(DIM),
                                                     args=_args(transformers, tmp_path / "b"),
                                                     train_dataset=Rows(), eval_dataset=Rows(7))
    assert _metrics(ours.evaluate()) == pytest.approx(_metrics(theirs.evaluate()), rel=1e-6)
    ours.train()
    theirs.train()
    assert _metrics(ours.evaluate()) == pytest.approx(_metrics(theirs.evaluate()), rel=1e-5)
    p_ours, p_theirs = ours.predict(Rows(7)), theirs.predict(Rows(7))
    np.testing.assert_allclose(p_ours.predictions, p_theirs.predictions, rtol=1e-5)
    assert p_ours.metrics["test_loss"] == pytest.approx(p_theirs.metrics["test_loss"], rel=1e-5)


def test_upstream_itself_rejects_the_old_compute_loss_in_evaluate(tmp_path):
    # why the helper exists: the oracle passes num_items_in_batch to compute_loss in prediction_step
    transformers = pytest.importorskip("transformers")
    theirs = _old_compute_loss_trainer(transformers)(model=SeededRegressor(DIM), args=_args(transformers, tmp_path),
                                                     eval_dataset=Rows(7))
    with pytest.raises(TypeError, match="num_items_in_batch"):
        theirs.evaluate()


def _old_training_step_trainer(lib, calls: list[int]):
    class OldStepTrainer(lib.Trainer):
        def training_step(self, model, inputs):  # seed 002's signature
            calls.append(len(inputs["x"]))
            return super().training_step(model, inputs)

    return OldStepTrainer


def test_old_training_step_with_short_last_accumulation_window(tmp_path):
    calls: list[int] = []
    args = _args(trainwell, tmp_path, gradient_accumulation_steps=3, num_train_epochs=1)
    trainer = _old_training_step_trainer(trainwell, calls)(model=SeededRegressor(DIM), args=args, train_dataset=Rows())
    out = trainer.train()
    assert calls == [4, 4, 4, 1]  # 13 rows, batches of 4: one full window of 3 and a short one of 1
    assert out.global_step == 2 and np.isfinite(out.training_loss)


@pytest.mark.slow  # over a second
def test_old_training_step_same_weights_as_upstream(tmp_path):
    transformers = pytest.importorskip("transformers")

    class NewStep(transformers.Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            return super().training_step(model, inputs, num_items_in_batch)

    ours = _old_training_step_trainer(trainwell, [])(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path / "a"),
                                                     train_dataset=Rows())
    theirs = NewStep(model=SeededRegressor(DIM), args=_args(transformers, tmp_path / "b"), train_dataset=Rows())
    ours.train()
    theirs.train()
    for a, b in zip(ours.model.parameters(), theirs.model.parameters()):
        torch.testing.assert_close(a.detach(), b.detach(), rtol=1e-5, atol=1e-6)


def test_old_create_scheduler_signature(tmp_path):
    seen: list[int] = []

    class OldScheduler(trainwell.Trainer):
        def create_scheduler(self, num_training_steps):  # seed 002's signature (no optimizer argument)
            seen.append(num_training_steps)
            self.lr_scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.5)
            return self.lr_scheduler

    args = _args(trainwell, tmp_path, num_train_epochs=1)
    trainer = OldScheduler(model=SeededRegressor(DIM), args=args, train_dataset=Rows())
    trainer.train()
    assert seen == [4]
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 4)


def test_old_create_optimizer_and_scheduler_signature(tmp_path):
    seen: list[int] = []

    class Old(trainwell.Trainer):
        def create_optimizer_and_scheduler(self, num_training_steps):
            seen.append(num_training_steps)
            super().create_optimizer_and_scheduler(num_training_steps)

    Old(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=3), train_dataset=Rows()).train()
    assert seen == [3]


def test_new_signatures_still_receive_the_new_arguments(tmp_path):
    got: dict[str, object] = {}

    class New(trainwell.Trainer):
        def create_scheduler(self, num_training_steps, optimizer=None):
            got["optimizer"] = optimizer
            return super().create_scheduler(num_training_steps, optimizer)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            got.setdefault("items", []).append(num_items_in_batch)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trainer = New(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=1), train_dataset=Rows())
    trainer.train()
    assert got["optimizer"] is trainer.optimizer


# ------------------------------------------------------------------------------------------ the helper itself
class _Host:
    def old(self, a, b):
        return (a, b)

    def new(self, a, b, c=None, *, d=None):
        return (a, b, c, d)

    def anything(self, *args, **kwargs):
        return (args, kwargs)


def test_call_override_drops_only_what_the_signature_lacks():
    host = _Host()
    assert call_override(host, "old", 1, 2, 3, d=4) == (1, 2)
    assert call_override(host, "new", 1, 2, 3, d=4) == (1, 2, 3, 4)
    assert call_override(host, "anything", 1, 2, 3, d=4) == ((1, 2, 3), {"d": 4})
    assert accepts(host, "old").takes("b") and not accepts(host, "old").takes("c")


def test_call_override_sees_a_later_monkey_patch():
    host = _Host()
    assert call_override(host, "new", 1, 2, 3) == (1, 2, 3, None)
    host.new = lambda a: ("patched", a)  # an instance attribute replaces the method: read its signature afresh
    assert call_override(host, "new", 1, 2, 3) == ("patched", 1)


def test_a_missing_required_argument_is_still_a_type_error():
    class Needs:
        def f(self, a, b, required):
            return a

    with pytest.raises(TypeError, match="required"):
        call_override(Needs(), "f", 1, 2)


def test_old_get_train_sampler_without_the_dataset_argument(tmp_path):
    class OldSampler(trainwell.Trainer):
        def _get_train_sampler(self):  # upstream 4.x signature: reads self.train_dataset
            return torch.utils.data.SequentialSampler(self.train_dataset)

    trainer = OldSampler(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, num_train_epochs=1),
                         train_dataset=Rows())
    loader = trainer.get_train_dataloader()
    first = next(iter(loader))
    torch.testing.assert_close(first["x"], Rows().x[:4])  # sequential: the override was used
    assert trainer.train().global_step == 4


def test_old_save_checkpoint_signature(tmp_path):
    saved: list[int] = []

    class OldSave(trainwell.Trainer):
        def _save_checkpoint(self, model, trial, metrics=None):  # upstream 4.x signature
            saved.append(self.state.global_step)
            return super()._save_checkpoint(model, trial)

    args = _args(trainwell, tmp_path, num_train_epochs=1, save_strategy="steps", save_steps=2)
    OldSave(model=SeededRegressor(DIM), args=args, train_dataset=Rows()).train()
    assert saved == [2, 4]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2",
                                                                                            "checkpoint-4"]
