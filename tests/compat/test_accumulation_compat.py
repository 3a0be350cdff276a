"""Gradient accumulation as a user sees it: every accumulation window updates the weights like one big batch of the
window's examples, and the logged ``loss`` / ``grad_norm`` agree with ``transformers.Trainer``.

Shapes: 1, 7 and 8 micro-batches per epoch; ``gradient_accumulation_steps`` 1, 3, 8 and 100 (windows longer than
the epoch); one and two epochs; ``max_steps`` ending inside an epoch; a model whose forward takes
``num_items_in_batch``, one that returns a per-batch mean, and a ``compute_loss`` override with the seeds' old
signature. The reference is a hand loop that concatenates each window into one batch. Both trainers read the data in
order (a ``SequentialSampler``), so the windows are the same items.

Where upstream itself is not a big batch (a window whose micro-batches differ in size: the epoch's short last batch
inside a longer window, with a per-batch mean loss), trainwell follows the big batch and the test pins the
difference.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import SequentialSampler

import trainwell

pytestmark = pytest.mark.slow  # trains on both libraries per case: over a second a test

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

BATCH = 2
LR = 0.1


class MeanModel(nn.Module):
    """A linear regression returning the per-batch mean squared error (no ``num_items_in_batch``)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels) if labels is not None else None, "logits": pred}


class ItemsModel(MeanModel):
    """The same regression normalised by ``num_items_in_batch`` (the examples of the whole window) when given."""

    def forward(self, x, labels=None, num_items_in_batch=None, **kwargs):
        pred = self.linear(x).squeeze(-1)
        total = F.mse_loss(pred, labels, reduction="sum")
        return {"loss": total / (num_items_in_batch if num_items_in_batch is not None else labels.numel()),
                "logits": pred}


def _sequential(cls: type) -> type:
    class InOrder(cls):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    return InOrder


TrainwellTrainer = _sequential(trainwell.Trainer)
UpstreamTrainer = _sequential(transformers.Trainer)


class OldSignatureTrainer(TrainwellTrainer):
    """A subclass written for the seeds' ``compute_loss(self, model, inputs, return_outputs=False)``."""

    def compute_loss(self, model, inputs, return_outputs=False):
        labels = inputs.pop("labels")
        pred = model(**inputs)["logits"]
        loss = F.mse_loss(pred, labels)
        return (loss, {"logits": pred}) if return_outputs else loss


def _data(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 3, generator=g)
    y = x @ torch.tensor([1.5, -2.0, 0.5]) + 0.3 * torch.randn(n, generator=g) + 1.0
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _options(ga: int, epochs: int, max_steps: int) -> dict:
    return dict(per_device_train_batch_size=BATCH, gradient_accumulation_steps=ga, num_train_epochs=epochs,
                max_steps=max_steps, optim="sgd", learning_rate=LR, lr_scheduler_type="constant",
                max_grad_norm=1e6, logging_steps=1, save_strategy="no", report_to="none", seed=0,
                disable_tqdm=True, weight_decay=0.0)


def _logged(history: list[dict]) -> tuple[list[float], list[float]]:
    steps = [e for e in history if "loss" in e and "train_loss" not in e]
    return [e["loss"] for e in steps], [e["grad_norm"] for e in steps]


def run_trainwell(tmp, data, ga, epochs, max_steps=-1, model_cls=MeanModel, trainer_cls=TrainwellTrainer):
    args = trainwell.TrainingArguments(output_dir=str(tmp), **_options(ga, epochs, max_steps))
    trainer = trainer_cls(model=model_cls(), args=args, train_dataset=data)
    result = trainer.train()
    return trainer.model, *_logged(trainer.state.log_history), result


def run_upstream(tmp, data, ga, epochs, max_steps=-1, model_cls=MeanModel):
    args = transformers.TrainingArguments(output_dir=str(tmp), use_cpu=True, **_options(ga, epochs, max_steps))
    trainer = UpstreamTrainer(model=model_cls(), args=args, train_dataset=data)
    result = trainer.train()
    return trainer.model, *_logged(trainer.state.log_history), result


def one_big_batch_per_window(data, ga, epochs, max_steps=-1):
    """The reference: each window's examples as one batch, SGD on the mean loss over them."""
    model = MeanModel()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x = torch.stack([d["x"] for d in data])
    y = torch.stack([d["labels"] for d in data])
    per_window = BATCH * ga
    windows_per_epoch = math.ceil(math.ceil(len(data) / BATCH) / ga)
    total = max_steps if max_steps > 0 else windows_per_epoch * epochs
    losses, norms = [], []
    while len(losses) < total:
        for start in range(0, len(data), per_window):
            loss = F.mse_loss(model.linear(x[start:start + per_window]).squeeze(-1), y[start:start + per_window])
            loss.backward()
            norms.append(float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))))
            losses.append(loss.item())
            opt.step()
            opt.zero_grad()
            if len(losses) == total:
                break
    return model, losses, norms


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-5, atol=1e-6, msg=name)


SHAPES = [  # (micro-batches per epoch, ga, epochs, max_steps)
    (1, 1, 2, -1), (1, 3, 2, -1), (7, 1, 1, -1), (7, 3, 2, -1), (7, 8, 2, -1), (7, 100, 1, -1),
    (8, 3, 2, -1), (8, 8, 1, -1), (8, 100, 2, -1), (7, 3, 2, 5), (8, 3, 1, 4),
]


@pytest.mark.parametrize("model_cls", [MeanModel, ItemsModel], ids=["mean", "num_items"])
@pytest.mark.parametrize("batches,ga,epochs,max_steps", SHAPES)
def test_every_window_is_one_big_batch(tmp_path, batches, ga, epochs, max_steps, model_cls):
    data = _data(batches * BATCH)
    model, losses, norms, _ = run_trainwell(tmp_path, data, ga, epochs, max_steps, model_cls)
    ref_model, ref_losses, ref_norms = one_big_batch_per_window(data, ga, epochs, max_steps)
    _assert_same_weights(model, ref_model)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert norms == pytest.approx(ref_norms, rel=1e-5)


@pytest.mark.parametrize("batches,ga,epochs,max_steps", [(7, 3, 2, -1), (7, 100, 1, -1), (8, 3, 2, 5)])
def test_old_compute_loss_signature_is_one_big_batch_too(tmp_path, batches, ga, epochs, max_steps):
    data = _data(batches * BATCH)
    model, losses, _, _ = run_trainwell(tmp_path, data, ga, epochs, max_steps, trainer_cls=OldSignatureTrainer)
    ref_model, ref_losses, _ = one_big_batch_per_window(data, ga, epochs, max_steps)
    _assert_same_weights(model, ref_model)
    assert losses == pytest.approx(ref_losses, rel=1e-5)


@pytest.mark.parametrize("model_cls", [MeanModel, ItemsModel], ids=["mean", "num_items"])
@pytest.mark.parametrize("batches,ga,epochs,max_steps", [(8, 3, 2, -1), (8, 100, 1, -1), (7, 8, 2, -1),
                                                          (1, 3, 1, -1), (7, 3, 2, 5)])
def test_logged_loss_and_grad_norm_agree_with_upstream(tmp_path, batches, ga, epochs, max_steps, model_cls):
    data = _data(batches * BATCH)
    ours = run_trainwell(tmp_path / "trainwell", data, ga, epochs, max_steps, model_cls)
    theirs = run_upstream(tmp_path / "upstream", data, ga, epochs, max_steps, model_cls)
    _assert_same_weights(ours[0], theirs[0])
    assert ours[1] == pytest.approx(theirs[1], rel=1e-5)  # loss of every step
    assert ours[2] == pytest.approx(theirs[2], rel=1e-5)  # grad_norm of every step
    assert ours[3].training_loss == pytest.approx(theirs[3].training_loss, rel=1e-5)
    assert ours[3].global_step == theirs[3].global_step


def test_issue_numbers_short_last_window(tmp_path):
    # 8 batches, ga=3: the epoch's last update has 2 micro-batches and is not scaled by 2/3
    data = _data(8 * BATCH)
    _, losses, _, _ = run_trainwell(tmp_path / "a", data, ga=3, epochs=1)
    _, ref_losses, _ = one_big_batch_per_window(data, ga=3, epochs=1)
    assert losses[-1] == pytest.approx(ref_losses[-1], rel=1e-5)
    # ga=100 with 8 batches: one update of the whole epoch, not scaled by 8/100
    _, losses, norms, _ = run_trainwell(tmp_path / "b", data, ga=100, epochs=1)
    _, ref_losses, ref_norms = one_big_batch_per_window(data, ga=100, epochs=1)
    assert losses == pytest.approx(ref_losses, rel=1e-5) and norms == pytest.approx(ref_norms, rel=1e-5)


@pytest.mark.parametrize("model_cls", [MeanModel, ItemsModel], ids=["mean", "num_items"])
def test_short_last_micro_batch_inside_a_window_weighs_its_rows(tmp_path, model_cls):
    # 13 examples in batches of 2: the last micro-batch holds one row. With ga=8 the epoch is one window of
    # 2+2+2+2+2+2+1 rows; one big batch weighs every row alike.
    data = _data(13)
    model, losses, norms, _ = run_trainwell(tmp_path / "ours", data, ga=8, epochs=2, model_cls=model_cls)
    ref_model, ref_losses, ref_norms = one_big_batch_per_window(data, ga=8, epochs=2)
    _assert_same_weights(model, ref_model)
    assert losses == pytest.approx(ref_losses, rel=1e-5) and norms == pytest.approx(ref_norms, rel=1e-5)
    upstream, up_losses, _, _ = run_upstream(tmp_path / "up", data, ga=8, epochs=2, model_cls=model_cls)
    if model_cls is ItemsModel:  # num_items_in_batch counts the rows: upstream is a big batch too
        _assert_same_weights(model, upstream)
        assert losses == pytest.approx(up_losses, rel=1e-5)
    else:  # upstream divides each micro-batch mean by 7, so the one-row batch weighs double (a documented difference)
        assert up_losses[0] != pytest.approx(ref_losses[0], rel=1e-5)


def test_odd_epochs_with_three_micro_batches_per_window(tmp_path):
    # 13 examples, ga=3: windows of 2+2+2, 2+2+2 and a lone 1-row batch; each is its own mean
    data = _data(13)
    model, losses, _, _ = run_trainwell(tmp_path, data, ga=3, epochs=2)
    ref_model, ref_losses, _ = one_big_batch_per_window(data, ga=3, epochs=2)
    _assert_same_weights(model, ref_model)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
