"""Acceptance tests of the Trainer: upstream-style scripts, determinism, exact accumulation, every knob."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainwell import Trainer, TrainerCallback, TrainingArguments
from helpers.callbacks import StopAtStep
from helpers.tensors import weights


def _logged(trainer: Trainer, key: str) -> dict[int, float]:
    """``{step: value}`` of ``key`` in the log history."""
    return {entry["step"]: entry[key] for entry in trainer.state.log_history if key in entry}


def _fresh(cls: type, *args: object, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return cls(*args)


# ------------------------------------------------------------------------------------ an upstream user script
class EventRecorder(TrainerCallback):
    """Records the name of every training event it receives (evaluation batches excluded)."""

    def __init__(self) -> None:
        self.events: list[str] = []


def _recording(event: str):
    def handler(self, args, state, control, **kwargs):
        self.events.append(event)

    return handler


for _event in ("on_init_end", "on_train_begin", "on_epoch_begin", "on_step_begin", "on_substep_end",
               "on_pre_optimizer_step", "on_optimizer_step", "on_step_end", "on_log", "on_evaluate", "on_save",
               "on_epoch_end", "on_train_end"):
    setattr(EventRecorder, _event, _recording(_event))


def compute_accuracy(eval_pred):
    """The usual accuracy metric of upstream examples."""
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


class WeightedLossTrainer(Trainer):
    """The seeds' custom weighted loss, written for the upstream API."""

    seen_losses: list[float]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        loss_fct = nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0], device=model.device))
        loss = loss_fct(logits.view(-1, self.model.config.num_labels), labels.view(-1))
        if model.training:  # evaluation calls compute_loss too
            self.seen_losses.append(loss.item())
        return (loss, outputs) if return_outputs else loss


def test_upstream_script_runs_with_custom_loss_metrics_and_callback(tiny, tmp_path):
    recorder = EventRecorder()
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4,
                             per_device_eval_batch_size=8, gradient_accumulation_steps=2, num_train_epochs=2,
                             learning_rate=0.1, logging_steps=2, eval_strategy="steps", eval_steps=2,
                             save_strategy="steps", save_steps=2, report_to="none", disable_tqdm=True)
    data = tiny.classification_data(16)
    trainer = WeightedLossTrainer(model=_fresh(tiny.ClassifierModel), args=args, train_dataset=data,
                                  eval_dataset=tiny.classification_data(24, seed=1),
                                  compute_metrics=compute_accuracy, callbacks=[recorder])
    trainer.seen_losses = []
    result = trainer.train()

    assert result.global_step == 4 and len(trainer.seen_losses) == 8  # 16 items / (4 x 2) x 2 epochs
    # the logged loss is the override's loss: mean over the 4 micro-batches of the 2-step window
    assert _logged(trainer, "loss")[2] == pytest.approx(sum(trainer.seen_losses[:4]) / 4, rel=1e-5)
    accuracy = _logged(trainer, "eval_accuracy")
    assert sorted(accuracy) == [2, 4]
    model = trainer.model.eval()
    with torch.no_grad():
        feats = torch.stack([d["features"] for d in tiny.classification_data(24, seed=1)])
        labels = torch.stack([d["labels"] for d in tiny.classification_data(24, seed=1)])
        expected = (model(feats)["logits"].argmax(-1) == labels).float().mean().item()
    assert accuracy[4] == pytest.approx(expected)
    assert trainer.evaluate()["eval_accuracy"] == pytest.approx(expected)

    step = ["on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"]
    log_eval_save = ["on_log", "on_log", "on_evaluate", "on_save"]  # training window, eval metrics, then save
    epoch = ["on_epoch_begin", *step, *step, *log_eval_save, "on_epoch_end"]
    expected_events = ["on_init_end", "on_train_begin", *epoch, *epoch, "on_log", "on_train_end"]
    assert recorder.events[: len(expected_events)] == expected_events


def test_legacy_compute_loss_signature_without_num_items(tiny, make_args):
    seen: list[float] = []

    class OldStyle(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False):  # the seeds' older signature
            outputs = model(**inputs)
            loss = outputs[0] * 2
            seen.append(loss.item())
            return (loss, outputs) if return_outputs else loss

    args = make_args(max_steps=2, gradient_accumulation_steps=2, logging_steps=1)
    trainer = OldStyle(model=_fresh(tiny.TokenLM), args=args, train_dataset=tiny.token_data(32))
    assert trainer.train().global_step == 2 and len(seen) == 4
    # its loss is a per-micro-batch mean, so the step's loss is the mean over the accumulated micro-batches
    assert _logged(trainer, "loss") == pytest.approx({1: (seen[0] + seen[1]) / 2, 2: (seen[2] + seen[3]) / 2})


def test_callback_stops_training(tiny, make_args):
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(num_train_epochs=3),
                      train_dataset=tiny.regression_data(64), callbacks=[StopAtStep(3)])
    result = trainer.train()
    assert result.global_step == 3 and trainer.state.global_step == 3
    assert trainer.state.max_steps == 24


# ----------------------------------------------------------------------------------------------- determinism
def _run(tiny, make_args, **overrides):
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(logging_steps=1, **overrides),
                      train_dataset=tiny.regression_data(48))
    trainer.train()
    return _logged(trainer, "loss"), weights(trainer.model)


def test_same_seed_same_losses_and_weights(tiny, make_args):
    losses_a, weights_a = _run(tiny, make_args, num_train_epochs=2)
    losses_b, weights_b = _run(tiny, make_args, num_train_epochs=2)
    assert len(losses_a) == 12 and losses_a == losses_b
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    losses_c, _ = _run(tiny, make_args, num_train_epochs=2, seed=1)  # another data order
    assert losses_c != losses_a


def test_full_determinism_gives_identical_runs(tiny, make_args, monkeypatch):
    for name in ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG"):  # restored after the test
        monkeypatch.delenv(name, raising=False)
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    try:
        losses_a, weights_a = _run(tiny, make_args, max_steps=3, full_determinism=True)
        assert torch.are_deterministic_algorithms_enabled()
        losses_b, weights_b = _run(tiny, make_args, max_steps=3, full_determinism=True)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
    assert losses_a == losses_b and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


# -------------------------------------------------------------------------------- exact gradient accumulation
def _train_lm(tiny, make_args, model_cls, data, batch, accumulation, optim, lr):
    args = make_args(per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                     num_train_epochs=2, optim=optim, learning_rate=lr, lr_scheduler_type="constant",
                     weight_decay=0.0, max_grad_norm=0.0, seed=3)
    trainer = Trainer(model=_fresh(model_cls), args=args, train_dataset=data)
    trainer.train()
    assert trainer.state.global_step == 4
    return trainer, weights(trainer.model)


def test_accumulation_samples_same_groups_as_big_batch(tiny, make_args):
    data = tiny.token_data(64)
    small = Trainer(model=tiny.TokenLM(), args=make_args(per_device_train_batch_size=8, seed=3,
                                                         gradient_accumulation_steps=4), train_dataset=data)
    big = Trainer(model=tiny.TokenLM(), args=make_args(per_device_train_batch_size=32, seed=3),
                  train_dataset=data)
    small_batches = [b["input_ids"] for b in small.get_train_dataloader()]
    big_batches = [b["input_ids"] for b in big.get_train_dataloader()]
    assert len(small_batches) == 8 and len(big_batches) == 2
    for i, big_batch in enumerate(big_batches):
        assert torch.equal(torch.cat(small_batches[4 * i: 4 * i + 4]), big_batch)


@pytest.mark.parametrize("optim,lr", [("sgd", 0.5), ("adamw_torch", 0.01)])
def test_accumulation_8x4_equals_32x1_token_mean(tiny, make_args, optim, lr):
    data = tiny.token_data(64)
    _, accumulated = _train_lm(tiny, make_args, tiny.TokenLM, data, 8, 4, optim, lr)
    _, single = _train_lm(tiny, make_args, tiny.TokenLM, data, 32, 1, optim, lr)
    initial = weights(_fresh(tiny.TokenLM))
    for name in single:
        assert not torch.allclose(single[name], initial[name])  # it trained
        torch.testing.assert_close(accumulated[name], single[name], atol=1e-6, rtol=1e-5)


def test_accumulation_without_num_items_is_exact_on_uneven_and_even_masks(tiny, make_args):
    # a token mean that ignores num_items_in_batch: each micro-batch weighs its share of the window's labels
    for data in (tiny.token_data(64), tiny.token_data(64, masked=False)):
        _, accumulated = _train_lm(tiny, make_args, tiny.TokenLMNoKwargs, data, 8, 4, "sgd", 0.5)
        _, single = _train_lm(tiny, make_args, tiny.TokenLMNoKwargs, data, 32, 1, "sgd", 0.5)
        for name in single:
            torch.testing.assert_close(accumulated[name], single[name], atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------------------------------ length of training
def test_max_steps_stops_exactly(tiny, make_args):
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(max_steps=5, num_train_epochs=10),
                      train_dataset=tiny.regression_data(64))
    result = trainer.train()
    assert result.global_step == 5 and trainer.state.max_steps == 5
    assert trainer.state.epoch == pytest.approx(5 / 8)
    assert result.metrics["epoch"] == pytest.approx(5 / 8)


def test_fractional_epochs_round_steps_up(tiny, make_args):
    # 40 items / batch 8 = 5 updates per epoch; 1.5 epochs -> ceil(7.5) = 8 steps
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(num_train_epochs=1.5),
                      train_dataset=tiny.regression_data(40))
    assert trainer.train().global_step == 8
    assert trainer.state.epoch == pytest.approx(1.6)


def test_dataloader_drop_last(tiny, make_args):
    data = tiny.regression_data(20)
    kept = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(), train_dataset=data)
    dropped = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(dataloader_drop_last=True),
                      train_dataset=data)
    assert kept.train().global_step == 3 * 3
    assert dropped.train().global_step == 2 * 3
    assert all(len(b["x"]) == 8 for b in dropped.get_train_dataloader())


# ------------------------------------------------------------------------------------------------------ logging
def test_logging_steps_and_first_step(tiny, make_args):
    trainer = Trainer(model=_fresh(tiny.RegressionModel),
                      args=make_args(max_steps=8, logging_steps=3, logging_first_step=True),
                      train_dataset=tiny.regression_data(64))
    trainer.train()
    assert sorted(_logged(trainer, "loss")) == [1, 3, 6]
    assert sorted(_logged(trainer, "learning_rate")) == [1, 3, 6]
    assert sorted(_logged(trainer, "grad_norm")) == [1, 3, 6]


def test_logging_strategy_epoch(tiny, make_args):
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(logging_strategy="epoch",
                                                                         num_train_epochs=3),
                      train_dataset=tiny.regression_data(32))
    trainer.train()
    entries = [e for e in trainer.state.log_history if "loss" in e]
    assert [(e["step"], e["epoch"]) for e in entries] == [(4, 1.0), (8, 2.0), (12, 3.0)]


def test_train_output_metrics_and_train_loss_is_mean_of_step_losses(tiny, make_args):
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(logging_steps=1, num_train_epochs=2),
                      train_dataset=tiny.regression_data(32))
    result = trainer.train()
    keys = {"train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos", "train_loss",
            "epoch"}
    assert keys <= set(result.metrics)
    step_losses = list(_logged(trainer, "loss").values())
    assert len(step_losses) == 8
    assert result.training_loss == pytest.approx(sum(step_losses) / 8, rel=1e-6)
    assert result.metrics["train_loss"] == result.training_loss
    assert result.metrics["epoch"] == 2.0 and result.global_step == 8
    assert result.metrics["total_flos"] == trainer.state.total_flos > 0
    rate = result.metrics["train_samples_per_second"] / result.metrics["train_steps_per_second"]
    assert rate == pytest.approx(64 / 8, rel=0.05)  # samples / steps = batch size
    assert trainer.state.log_history[-1]["train_loss"] == result.training_loss


def test_learning_rate_schedule_logged_matches_formula(tiny, make_args):
    args = make_args(max_steps=6, logging_steps=1, learning_rate=0.1, warmup_steps=2, lr_scheduler_type="linear")
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(64))
    trainer.train()
    # the rate each step used (upstream 5.x logs it; the rate after the scheduler moved is one step ahead)
    linear = {s: 0.1 * ((s - 1) / 2 if s - 1 < 2 else max(0.0, (7 - s) / 4)) for s in range(1, 7)}
    assert _logged(trainer, "learning_rate") == pytest.approx(linear)

    args = make_args(max_steps=5, logging_steps=1, learning_rate=0.1, lr_scheduler_type="cosine")
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(64))
    trainer.train()
    cosine = {s: 0.1 * 0.5 * (1 + math.cos(math.pi * (s - 1) / 5)) for s in range(1, 6)}
    assert _logged(trainer, "learning_rate") == pytest.approx(cosine, abs=1e-12)


# ------------------------------------------------------------------------------------------ saving, evaluation
CHECKPOINT_FILES = ["model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth",
                    ".complete"]


def _checkpoints(output_dir: str) -> list[str]:
    return sorted((d for d in os.listdir(output_dir) if d.startswith("checkpoint-")),
                  key=lambda d: int(d.split("-")[1]))


def test_save_strategy_steps_writes_complete_checkpoints(tiny, make_args):
    args = make_args(max_steps=5, save_strategy="steps", save_steps=2)
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(64))
    trainer.train()
    assert _checkpoints(args.output_dir) == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    for name in _checkpoints(args.output_dir):
        folder = os.path.join(args.output_dir, name)
        for file in CHECKPOINT_FILES:
            assert os.path.exists(os.path.join(folder, file)), (name, file)
        with open(os.path.join(folder, "trainer_state.json")) as fh:
            assert json.load(fh)["global_step"] == int(name.split("-")[1])


def test_save_strategy_epoch_and_total_limit_rotation(tiny, make_args):
    args = make_args(num_train_epochs=3, save_strategy="epoch")
    Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(32)).train()
    assert _checkpoints(args.output_dir) == ["checkpoint-4", "checkpoint-8", "checkpoint-12"]

    args = make_args(output_dir=args.output_dir + "-limited", max_steps=7, save_strategy="steps", save_steps=1,
                     save_total_limit=2)
    Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(64)).train()
    assert _checkpoints(args.output_dir) == ["checkpoint-6", "checkpoint-7"]


def test_eval_strategy_steps_and_epoch_log_eval_loss(tiny, make_args):
    args = make_args(max_steps=6, eval_strategy="steps", eval_steps=2)
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(64),
                      eval_dataset=tiny.regression_data(16, seed=1))
    trainer.train()
    eval_loss = _logged(trainer, "eval_loss")
    assert sorted(eval_loss) == [2, 4, 6]
    assert trainer.evaluate()["eval_loss"] == pytest.approx(eval_loss[6], rel=1e-6)
    with torch.no_grad():
        eval_items = tiny.regression_data(16, seed=1)
        x = torch.stack([d["x"] for d in eval_items])
        y = torch.stack([d["labels"] for d in eval_items])
        expected = F.mse_loss(trainer.model(x)["logits"], y).item()
    assert eval_loss[6] == pytest.approx(expected, rel=1e-5)

    args = make_args(num_train_epochs=2, eval_strategy="epoch")
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(24),
                      eval_dataset=tiny.regression_data(16, seed=1))
    trainer.train()
    assert sorted(_logged(trainer, "eval_loss")) == [3, 6]
    assert [e["epoch"] for e in trainer.state.log_history if "eval_loss" in e] == [1.0, 2.0]


# ------------------------------------------------------------------------------------------------ optimisation
def test_max_grad_norm_clips_like_by_hand(tiny, make_args):
    data = tiny.regression_data(16)
    model = _fresh(tiny.RegressionModel)
    x = torch.stack([d["x"] for d in data])
    y = torch.stack([d["labels"] for d in data])
    reference = _fresh(tiny.RegressionModel)
    F.mse_loss(reference(x)["logits"], y).backward()
    grads = [p.grad.clone() for p in reference.parameters()]
    norm = torch.sqrt(sum((g ** 2).sum() for g in grads)).item()
    assert norm > 0.05  # so that clipping to 0.05 bites
    args = make_args(max_steps=1, per_device_train_batch_size=16, optim="sgd", learning_rate=0.1,
                     lr_scheduler_type="constant", max_grad_norm=0.05, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert _logged(trainer, "grad_norm")[1] == pytest.approx(norm, rel=1e-5)
    coef = 0.05 / (norm + 1e-6)
    for p, p0, g in zip(trainer.model.parameters(), reference.parameters(), grads):
        torch.testing.assert_close(p.detach(), p0.detach() - 0.1 * coef * g, atol=1e-6, rtol=1e-5)


def test_optimizers_passed_in_are_used(tiny, make_args):
    model = _fresh(tiny.RegressionModel)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    trainer = Trainer(model=model, args=make_args(max_steps=3, logging_steps=1), train_dataset=tiny.regression_data(64),
                      optimizers=(optimizer, scheduler))
    trainer.train()
    assert trainer.optimizer is optimizer and trainer.lr_scheduler is scheduler
    assert _logged(trainer, "learning_rate") == pytest.approx({1: 0.2, 2: 0.1, 3: 0.2 / 3})  # the rate each step used


def test_label_smoothing_loss_matches_hand_computation(tiny, make_args):
    data = tiny.classification_data(16)
    model = _fresh(tiny.ClassifierModel)
    feats = torch.stack([d["features"] for d in data])
    labels = torch.stack([d["labels"] for d in data])
    with torch.no_grad():
        log_probs = F.log_softmax(model(feats)["logits"], dim=-1)
    nll = -log_probs.gather(1, labels[:, None]).mean()
    uniform = -log_probs.mean()
    expected = (0.9 * nll + 0.1 * uniform).item()
    args = make_args(max_steps=1, per_device_train_batch_size=16, label_smoothing_factor=0.1, logging_steps=1)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    assert _logged(trainer, "loss")[1] == pytest.approx(expected, rel=1e-5)
    assert expected != pytest.approx(F.cross_entropy(model(feats)["logits"], labels).item(), rel=1e-3)


# --------------------------------------------------------------------------------------------------- data path
class StrictModel(nn.Module):
    """Accepts only ``x`` and ``labels``: an unexpected column crashes it."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.seen_keys: list[set[str]] = []

    def forward(self, x, labels=None):
        self.seen_keys.append({"x", "labels"})
        return {"loss": F.mse_loss(self.linear(x).squeeze(-1), labels)}


class LooseModel(StrictModel):
    """Accepts any extra keyword and records the keys it got."""

    def forward(self, x, labels=None, **extra):
        self.seen_keys.append({"x", "labels", *extra})
        return {"loss": F.mse_loss(self.linear(x).squeeze(-1), labels)}


def _with_extra(tiny, n=16):
    return [{**d, "extra": torch.tensor(float(i))} for i, d in enumerate(tiny.regression_data(n))]


def test_remove_unused_columns(tiny, make_args):
    trainer = Trainer(model=StrictModel(), args=make_args(max_steps=2), train_dataset=_with_extra(tiny))
    assert trainer.train().global_step == 2

    strict = Trainer(model=StrictModel(), args=make_args(max_steps=2, remove_unused_columns=False),
                     train_dataset=_with_extra(tiny))
    with pytest.raises(TypeError, match="extra"):
        strict.train()

    loose = LooseModel()
    Trainer(model=loose, args=make_args(max_steps=2, remove_unused_columns=False),
            train_dataset=_with_extra(tiny)).train()
    assert loose.seen_keys == [{"x", "labels", "extra"}] * 2


class MemoryModel(nn.Module):
    """Returns ``(loss, logits, mems)`` and records the ``mems`` it was given (for ``past_index``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.received: list[torch.Tensor | None] = []
        self.returned: list[torch.Tensor] = []

    def forward(self, x, labels=None, mems=None):
        self.received.append(None if mems is None else mems.clone())
        pred = self.linear(x).squeeze(-1)
        new_mems = pred.detach() + (0 if mems is None else mems)
        self.returned.append(new_mems.clone())
        return F.mse_loss(pred, labels), pred, new_mems


def test_past_index_feeds_mems_back(tiny, make_args):
    model = MemoryModel()
    Trainer(model=model, args=make_args(max_steps=3, past_index=2), train_dataset=tiny.regression_data(64)).train()
    assert model.received[0] is None
    assert torch.equal(model.received[1], model.returned[0]) and torch.equal(model.received[2], model.returned[1])

    model = MemoryModel()  # 16 items = 2 steps per epoch: the memory starts empty again at each epoch
    Trainer(model=model, args=make_args(max_steps=3, past_index=2), train_dataset=tiny.regression_data(16)).train()
    assert model.received[0] is None and model.received[2] is None
    assert torch.equal(model.received[1], model.returned[0])

    model = MemoryModel()
    Trainer(model=model, args=make_args(max_steps=2), train_dataset=tiny.regression_data(64)).train()
    assert model.received == [None, None]


# ------------------------------------------------------------------------------------------------ model options
def test_gradient_checkpointing_gives_same_weights(tiny, make_args):
    data = tiny.regression_data(32)
    plain = Trainer(model=_fresh(tiny.BlockStack), args=make_args(max_steps=3), train_dataset=data)
    plain.train()
    ckpt = Trainer(model=_fresh(tiny.BlockStack), args=make_args(max_steps=3, gradient_checkpointing=True),
                   train_dataset=data)
    calls = []
    ckpt.model.blocks[0][0].register_forward_hook(lambda *_: calls.append(1))
    ckpt.train()
    assert len(calls) == 2 * 3  # forward, then recomputed in backward, at each of the 3 steps
    assert all(getattr(block, "_trainwell_checkpointed", False) for block in ckpt.model.blocks)
    a, b = weights(plain.model), weights(ckpt.model)
    assert not torch.equal(a["inp.weight"], weights(_fresh(tiny.BlockStack))["inp.weight"])
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-7, rtol=1e-6)


def test_torch_compile_eager_backend_trains_like_eager(tiny, make_args):
    data = tiny.regression_data(32)
    plain = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(max_steps=2), train_dataset=data)
    plain.train()
    compiled = Trainer(model=_fresh(tiny.RegressionModel),
                       args=make_args(max_steps=2, torch_compile=True, torch_compile_backend="eager"),
                       train_dataset=data)
    compiled.train()
    assert hasattr(compiled.model_wrapped, "_orig_mod")
    a, b = weights(plain.model), weights(compiled.model)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-7, rtol=1e-6)


def test_model_init_recreates_model_at_train(tiny, make_args):
    built: list[nn.Module] = []

    def model_init():
        built.append(tiny.RegressionModel())
        return built[-1]

    trainer = Trainer(model_init=model_init, args=make_args(max_steps=2), train_dataset=tiny.regression_data(64))
    assert len(built) == 1 and trainer.model is built[0]
    trainer.train()
    first = weights(trainer.model)
    assert len(built) == 2 and trainer.model is built[1]
    trainer.train()
    assert len(built) == 3 and trainer.model is built[2]
    assert all(torch.equal(first[k], v) for k, v in weights(trainer.model).items())  # seeded before model_init


# --------------------------------------------------------------------------------------- saving and reporting
def test_save_model_reloads_to_equal_weights(tiny, make_args, tmp_path):
    from safetensors.torch import load_file

    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=make_args(max_steps=2),
                      train_dataset=tiny.regression_data(64))
    trainer.train()
    target = tmp_path / "final"
    trainer.save_model(str(target))
    assert (target / "model.safetensors").exists() and (target / "training_args.bin").exists()
    loaded = load_file(str(target / "model.safetensors"))
    final = weights(trainer.model)
    assert set(loaded) == set(final) and all(torch.equal(loaded[k], final[k]) for k in final)
    fresh = tiny.RegressionModel()
    fresh.load_state_dict(loaded)
    assert torch.equal(fresh.linear.weight, trainer.model.linear.weight)


def test_save_state_metrics_and_log_metrics(tiny, make_args, capsys):
    args = make_args(max_steps=2, logging_steps=1)
    trainer = Trainer(model=_fresh(tiny.RegressionModel), args=args, train_dataset=tiny.regression_data(64))
    metrics = trainer.train().metrics
    trainer.save_state()
    with open(os.path.join(args.output_dir, "trainer_state.json")) as fh:
        state = json.load(fh)
    assert state["global_step"] == 2 and [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2]

    trainer.save_metrics("train", metrics)
    trainer.save_metrics("eval", {"eval_loss": 0.25})
    with open(os.path.join(args.output_dir, "train_results.json")) as fh:
        assert json.load(fh)["train_loss"] == pytest.approx(metrics["train_loss"])
    with open(os.path.join(args.output_dir, "all_results.json")) as fh:
        combined = json.load(fh)
    assert combined["eval_loss"] == 0.25 and combined["train_loss"] == pytest.approx(metrics["train_loss"])

    capsys.readouterr()
    trainer.log_metrics("train", {"train_loss": 0.123456, "train_runtime": 3725.5, "total_flos": 3 * 2 ** 30})
    out = capsys.readouterr().out
    assert "***** train metrics *****" in out
    assert "0.1235" in out and "1:02:05.50" in out and "3GF" in out
    formatted = trainer.metrics_format({"train_runtime": 61.25, "train_loss": 1 / 3, "total_flos": 2.0 ** 31})
    assert formatted == {"train_runtime": "0:01:01.25", "train_loss": 0.3333, "total_flos": "2GF"}


# ---------------------------------------------------------------------------------------------- small methods
def test_callback_management(tiny, make_args):
    from trainwell import DefaultFlowCallback, PrinterCallback

    trainer = Trainer(model=tiny.RegressionModel(), args=make_args())
    types = lambda: [type(c) for c in trainer.callback_handler.callbacks]
    assert DefaultFlowCallback in types() and PrinterCallback in types()
    stopper = StopAtStep(2)
    trainer.add_callback(stopper)
    trainer.add_callback(EventRecorder)
    assert StopAtStep in types() and EventRecorder in types()
    assert trainer.pop_callback(StopAtStep) is stopper and StopAtStep not in types()
    popped = trainer.pop_callback(EventRecorder)
    assert isinstance(popped, EventRecorder) and EventRecorder not in types()
    trainer.remove_callback(PrinterCallback)
    assert PrinterCallback not in types()
    trainer.remove_callback(trainer.callback_handler.callbacks[0])
    assert DefaultFlowCallback not in types()


def test_num_examples_flops_and_process_zero(tiny, make_args):
    trainer = Trainer(model=tiny.TokenLM(), args=make_args(), train_dataset=tiny.token_data(20))
    assert trainer.num_examples(trainer.get_train_dataloader()) == 20
    params = sum(p.numel() for p in trainer.model.parameters())
    batch = {"input_ids": torch.zeros(4, 6, dtype=torch.long), "labels": torch.zeros(4, 6, dtype=torch.long)}
    assert trainer.floating_point_ops(batch) == 6 * params * 24
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()
    trainer.train()
    assert trainer.state.total_flos == 6 * params * 6 * 20 * 3  # 20 rows of 6 tokens, 3 epochs
