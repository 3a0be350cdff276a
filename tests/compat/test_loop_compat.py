"""The training loop's documented options, written as user scripts and checked against ``transformers.Trainer``:
``skip_memory_metrics=False`` (memory metrics in train/evaluate/predict), ``logging_nan_inf_filter=False`` with a
diverging loss (logged, training goes on; stopping is the opt-in ``StopOnNonFiniteLossCallback``), and
``auto_find_batch_size`` (a smaller batch after an out-of-memory error)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import SequentialSampler

import trainwell
from trainwell import StopOnNonFiniteLossCallback

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels) if labels is not None else None, "logits": pred}


def _data(n: int = 16, scale: float = 1.0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 3, generator=g) * scale
    y = x @ torch.tensor([1.0, -2.0, 0.5]) + 1.0
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _in_order(cls: type) -> type:
    class InOrder(cls):
        def _get_train_sampler(self, *args, **kwargs):
            return SequentialSampler(self.train_dataset)

    return InOrder


Ours, Theirs = _in_order(trainwell.Trainer), _in_order(transformers.Trainer)


def _opts(**overrides) -> dict:
    base = dict(per_device_train_batch_size=4, per_device_eval_batch_size=4, num_train_epochs=1, optim="sgd",
                learning_rate=0.05, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                report_to="none", seed=0, disable_tqdm=True)
    return {**base, **overrides}


def ours(tmp, model=None, callbacks=None, **overrides):
    args = trainwell.TrainingArguments(output_dir=str(tmp), **_opts(**overrides))
    return Ours(model=model or Regression(), args=args, train_dataset=_data(), eval_dataset=_data(8),
                callbacks=callbacks)


def theirs(tmp, model=None, **overrides):
    args = transformers.TrainingArguments(output_dir=str(tmp), use_cpu=True, **_opts(**overrides))
    return Theirs(model=model or Regression(), args=args, train_dataset=_data(), eval_dataset=_data(8))


def _memory_keys(metrics: dict) -> set[str]:
    return {key for key in metrics if "_mem_" in key}


# ------------------------------------------------------------------------------------ C. skip_memory_metrics=False
@pytest.mark.slow  # about 30 s on 2 cores
def test_memory_metrics_in_train_evaluate_and_predict(tmp_path):
    pytest.importorskip("psutil")
    trainer = ours(tmp_path / "ours", skip_memory_metrics=False)
    train_metrics = trainer.train().metrics  # used to raise "TrainerMemoryTracker was called from '_finish_training'"
    eval_metrics = trainer.evaluate()
    test_metrics = trainer.predict(_data(8)).metrics
    assert {"train_mem_cpu_alloc_delta", "train_mem_cpu_peaked_delta"} <= set(train_metrics)
    assert {"eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta"} <= set(eval_metrics)
    assert {"test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"} <= set(test_metrics)
    for metrics in (train_metrics, eval_metrics, test_metrics):
        assert all(isinstance(metrics[key], int) for key in _memory_keys(metrics))
        assert all(metrics[key] >= 0 for key in metrics if key.endswith("_peaked_delta"))
    logged = next(entry for entry in trainer.state.log_history if "train_runtime" in entry)
    assert logged["train_mem_cpu_alloc_delta"] == train_metrics["train_mem_cpu_alloc_delta"]

    upstream = theirs(tmp_path / "theirs", skip_memory_metrics=False)
    assert _memory_keys(train_metrics) == _memory_keys(upstream.train().metrics)
    assert _memory_keys(eval_metrics) == _memory_keys(upstream.evaluate())
    assert _memory_keys(test_metrics) == _memory_keys(upstream.predict(_data(8)).metrics)


@pytest.mark.slow  # about 12 s
def test_memory_metrics_again_after_a_failed_train(tmp_path):
    pytest.importorskip("psutil")

    class FailOnce(Regression):
        failed = False

        def forward(self, x, labels=None):
            if self.training and not FailOnce.failed:
                FailOnce.failed = True
                raise KeyError("boom")
            return super().forward(x, labels)

    trainer = ours(tmp_path, model=FailOnce(), skip_memory_metrics=False)
    with pytest.raises(KeyError):
        trainer.train()
    assert {"eval_mem_cpu_alloc_delta"} <= set(trainer.evaluate())  # not swallowed by the failed train stage
    assert {"train_mem_cpu_alloc_delta"} <= set(trainer.train().metrics)


# ------------------------------------------------------------------------------------ D. logging_nan_inf_filter=False
def _losses(history: list[dict]) -> list[float]:
    return [entry["loss"] for entry in history if "loss" in entry]


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return a == pytest.approx(b, rel=1e-4)


DIVERGING = dict(learning_rate=1e3, max_grad_norm=0.0, logging_nan_inf_filter=False, num_train_epochs=4)


@pytest.mark.slow  # over a second
def test_diverging_loss_is_logged_and_training_goes_on_as_upstream(tmp_path):
    trainer = ours(tmp_path / "ours", **DIVERGING)
    result = trainer.train()  # no FloatingPointError: upstream trains on
    logged = _losses(trainer.state.log_history)
    assert trainer.state.global_step == trainer.state.max_steps == 16
    upstream = theirs(tmp_path / "theirs", **DIVERGING)
    upstream_result = upstream.train()
    expected = _losses(upstream.state.log_history)
    assert len(logged) == len(expected) == 16
    first_bad = next(i for i, v in enumerate(expected) if not math.isfinite(v))
    assert 0 < first_bad < 15
    # the same values up to the first inf/nan, and inf/nan from there on in both (upstream's running sum stays nan
    # after it: tr_loss -= tr_loss; trainwell logs each window's own value, here inf then nan)
    assert all(_same(a, b) for a, b in zip(logged[:first_bad + 1], expected[:first_bad + 1])), (logged, expected)
    assert not any(math.isfinite(v) for v in logged[first_bad:])
    assert math.isnan(logged[-1]) and math.isnan(expected[-1])
    assert torch.isnan(trainer.model.linear.weight).all() and torch.isnan(upstream.model.linear.weight).all()
    assert not math.isfinite(result.training_loss) and not math.isfinite(upstream_result.training_loss)


def test_stopping_on_divergence_is_an_opt_in_callback(tmp_path):
    trainer = ours(tmp_path, callbacks=[StopOnNonFiniteLossCallback()], save_strategy="steps", save_steps=1,
                   **DIVERGING)
    with pytest.raises(FloatingPointError, match=r"diverged.*NaN/inf at step (\d+).*last checkpoint is") as info:
        trainer.train()
    step = trainer.state.global_step
    assert f"at step {step}" in str(info.value) and f"checkpoint-{step - 1}" in str(info.value)
    saved = sorted(int(p.name.split("-")[1]) for p in tmp_path.glob("checkpoint-*"))
    assert saved == list(range(1, step))  # the diverged weights of the last step were not saved


def test_divergence_callback_can_end_training_without_raising(tmp_path):
    trainer = ours(tmp_path, callbacks=[StopOnNonFiniteLossCallback(raise_error=False)], **DIVERGING)
    trainer.train()
    stopped = trainer.state.global_step
    assert stopped < trainer.state.max_steps
    assert len(_losses(trainer.state.log_history)) == stopped - 1  # the diverged step was not logged
    # a healthy run never trips it
    healthy = ours(tmp_path / "healthy", callbacks=[StopOnNonFiniteLossCallback()])
    assert healthy.train().global_step == 4


# ------------------------------------------------------------------------------------ E. auto_find_batch_size
class OutOfMemoryAbove(Regression):
    """Raises the CUDA out-of-memory error for a training batch larger than ``limit``."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.tried = limit, []

    def forward(self, x, labels=None):
        if self.training:
            self.tried.append(x.shape[0])
            if x.shape[0] > self.limit:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 7.00 GiB total)")
        return super().forward(x, labels)


@pytest.mark.slow  # about 18 s
def test_auto_find_batch_size_retries_smaller_after_out_of_memory(tmp_path):
    model = OutOfMemoryAbove(limit=5)
    trainer = ours(tmp_path / "ours", model=model, auto_find_batch_size=True, per_device_train_batch_size=8,
                   save_strategy="epoch")
    result = trainer.train()
    assert trainer.state.train_batch_size == 5  # 8 -> 7 -> 6 -> 5 (x0.9, as accelerate)
    assert model.tried[:3] == [8, 7, 6] and set(model.tried[3:]) <= {5, 1}  # 16 rows: batches of 5, 5, 5, 1
    assert result.global_step == 4
    state = json.loads((tmp_path / "ours" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["train_batch_size"] == 5
    assert trainer.args.per_device_train_batch_size == 8  # the arguments are left as given

    plain = ours(tmp_path / "plain", per_device_train_batch_size=5)
    plain.train()
    torch.testing.assert_close(trainer.model.linear.weight, plain.model.linear.weight)

    upstream_model = OutOfMemoryAbove(limit=5)
    upstream = theirs(tmp_path / "theirs", model=upstream_model, auto_find_batch_size=True,
                      per_device_train_batch_size=8)
    up = upstream.train()
    assert upstream.state.train_batch_size == trainer.state.train_batch_size
    assert upstream_model.tried == model.tried and up.global_step == result.global_step
    torch.testing.assert_close(trainer.model.linear.weight, upstream.model.linear.weight, rtol=1e-5, atol=1e-6)
    assert _losses(trainer.state.log_history) == pytest.approx(_losses(upstream.state.log_history), rel=1e-5)


@pytest.mark.slow  # over a second
def test_auto_find_batch_size_resumes_with_the_size_found(tmp_path):
    first = ours(tmp_path, model=OutOfMemoryAbove(limit=5), auto_find_batch_size=True, per_device_train_batch_size=8,
                 save_strategy="steps", save_steps=2, max_steps=2)
    first.train()
    model = OutOfMemoryAbove(limit=5)
    resumed = ours(tmp_path, model=model, auto_find_batch_size=True, per_device_train_batch_size=8, max_steps=4)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert 8 not in model.tried and resumed.state.train_batch_size == 5 and resumed.state.global_step == 4


def test_out_of_memory_without_auto_find_batch_size_propagates(tmp_path):
    trainer = ours(tmp_path, model=OutOfMemoryAbove(limit=5), per_device_train_batch_size=8)
    with pytest.raises(torch.OutOfMemoryError):
        trainer.train()


def test_other_errors_are_not_retried(tmp_path):
    class Broken(Regression):
        calls = 0

        def forward(self, x, labels=None):
            Broken.calls += 1
            raise RuntimeError("shapes do not match")

    trainer = ours(tmp_path, model=Broken(), auto_find_batch_size=True)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        trainer.train()
    assert Broken.calls == 1


@pytest.mark.slow  # over a second
def test_out_of_memory_at_batch_size_one_says_so(tmp_path):
    trainer = ours(tmp_path, model=OutOfMemoryAbove(limit=0), auto_find_batch_size=True, per_device_train_batch_size=2)
    with pytest.raises(RuntimeError, match="out of memory even with a batch size of 1 per device"):
        trainer.train()
    assert isinstance(Path(tmp_path), Path)


# ------------------------------------------------------------------------------------ F. the loop's typed state
def test_loop_state_is_what_the_loop_owns_and_upstream_attributes_still_read(tmp_path):
    from trainwell.loops.train_loop import LoopState

    seen = []

    class ReadsPrivateAttributes(trainwell.TrainerCallback):  # as some upstream user callbacks do
        def on_log(self, args, state, control, **kwargs):
            seen.append((trainer._globalstep_last_logged, trainer._total_loss_scalar))

    trainer = ours(tmp_path, callbacks=[ReadsPrivateAttributes()], logging_steps=2)
    assert trainer._globalstep_last_logged == 0 and trainer._total_loss_scalar == 0.0
    result = trainer.train()
    assert isinstance(trainer._tw_run.loop, LoopState)
    losses = _losses(trainer.state.log_history)
    assert [step for step, _ in seen[:2]] == [2, 4]
    assert seen[1][1] == pytest.approx(2 * sum(losses), rel=1e-6)  # the logged windows summed
    assert result.training_loss == pytest.approx(trainer._total_loss_scalar / 4, rel=1e-6)


def test_run_attributes_set_before_the_first_train_are_that_trainers_and_then_the_runs(tmp_path):
    """``current_flos``... are values of the running (or last) train() call; before the first one, each Trainer keeps
    its own (the attribute lives on the class)."""
    first, other = ours(tmp_path / "a"), ours(tmp_path / "b")
    first.current_flos, first.current_gradient_accumulation_steps = 7.0, 3
    assert (first.current_flos, first.current_gradient_accumulation_steps) == (7.0, 3)
    assert (other.current_flos, other.current_gradient_accumulation_steps, other._total_loss_scalar) == (0.0, 1, 0.0)
    first.store_flos()  # upstream's: adds the counted FLOPs to the state and restarts the count
    assert first.state.total_flos == 7.0 and first.current_flos == 0.0
    first.train()
    loop = first._tw_run.loop
    assert first.state.total_flos > 0 and first.current_flos == loop.flos == 0.0  # stored at the end of training
    first.current_flos = 2.5
    assert loop.flos == 2.5 and other.current_flos == 0.0


def test_a_resume_takes_its_own_rank_running_loss():
    from trainwell.loops.loop_state import DataPosition

    position = DataPosition(tr_loss=1.0, tr_loss_per_rank=[1.0, 3.0])
    assert position.running_loss_of(1, world_size=2) == 3.0
    assert position.running_loss_of(0, world_size=1) == 2.0  # another world size: the mean the next log averages
    assert DataPosition(tr_loss=1.5).running_loss_of(1, world_size=2) == 1.5  # a checkpoint from before
    assert DataPosition.from_dict({"tr_loss": 0.5, "unknown": 1}).tr_loss_per_rank is None


def test_loss_divisors_weigh_micro_batches_by_rows():
    from trainwell.loops.train_loop import loss_divisors

    batch = lambda rows: {"x": torch.zeros(rows, 3), "labels": torch.zeros(rows)}
    assert loss_divisors([batch(2)]) == [1]
    assert loss_divisors([batch(2), batch(2), batch(2)]) == [3, 3, 3]
    assert loss_divisors([batch(2), batch(2), batch(1)]) == [2.5, 2.5, 5.0]
    assert loss_divisors([[1, 2], [3]]) == [2, 2]  # rows unknown: the number of micro-batches
