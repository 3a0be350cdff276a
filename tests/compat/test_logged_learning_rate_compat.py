"""The logged ``learning_rate`` is the rate the optimizer step just used, as the installed ``transformers.Trainer``
logs it: linear decay of 1e-4 over 24 steps logs 1e-4 at step 1, 8.75e-05 at step 4 and 4.17e-06 at step 24 (not
the rate the scheduler moved to afterwards: 8.33e-05 and 0.0). The same number reaches ``log_history`` (what the
plot reads), every callback's ``on_log`` (console, trackers) and ``train.log``.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.models import SeededRegressor

transformers = pytest.importorskip("transformers")

STEPS = 24
LR = 1e-4


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * 2, 3, generator=g)
    return [{"x": x[i], "labels": x[i].sum()} for i in range(len(x))]


def _run(lib, out, callbacks=(), **extra):
    args = lib.TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, max_steps=STEPS,
                                 learning_rate=LR, lr_scheduler_type="linear", logging_steps=4, save_strategy="no",
                                 report_to="none", disable_tqdm=True, use_cpu=True, seed=0, **extra)
    trainer = lib.Trainer(model=SeededRegressor(), args=args, train_dataset=_data(), callbacks=list(callbacks))
    trainer.train()
    return [(e["step"], e["learning_rate"]) for e in trainer.state.log_history if "learning_rate" in e]


@pytest.mark.slow  # over a second
@pytest.mark.parametrize("ga", [1, 2])
def test_logged_rate_is_the_one_the_step_used_as_upstream(tmp_path, ga):
    import trainwell
    from trainwell.callbacks import TrainerCallback
    from trainwell.callbacks.logfile import LogFileCallback

    class Seen(TrainerCallback):
        def __init__(self) -> None:
            self.rates = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "learning_rate" in logs:
                self.rates.append((state.global_step, logs["learning_rate"]))

    seen = Seen()
    ours = _run(trainwell, tmp_path / "ours", [seen, LogFileCallback()], gradient_accumulation_steps=ga)
    transformers.logging.set_verbosity_error()
    theirs = _run(transformers, tmp_path / "theirs", gradient_accumulation_steps=ga)
    expected = [(step, LR * (1 - (step - 1) / STEPS)) for step in range(4, STEPS + 1, 4)]
    assert [s for s, _ in ours] == [s for s, _ in theirs] == [s for s, _ in expected]
    assert [r for _, r in ours] == pytest.approx([r for _, r in theirs], rel=1e-9)
    assert [r for _, r in ours] == pytest.approx([r for _, r in expected], rel=1e-9)
    assert ours[0][1] == pytest.approx(8.75e-05) and ours[-1][1] == pytest.approx(4.1667e-06, rel=1e-4)
    assert seen.rates == ours  # what the console and the trackers get
    lines = [line for line in (tmp_path / "ours" / "train.log").read_text().splitlines() if "learning_rate" in line]
    assert [json.loads(line.split(" ", 4)[4])["learning_rate"] for line in lines] == [r for _, r in ours]


def _handed_rates(lib, out, *, steps: int = 6) -> list[tuple[int, float | None]]:
    """``(global_step, learning_rate)`` of every ``_maybe_log_save_evaluate`` call of a ``lib.Trainer`` subclass that
    overrides it with upstream's signature (as TRL's OnlineDPOTrainer does), over one epoch of ``steps`` steps."""

    class Recording(lib.Trainer):
        handed: list[tuple[int, float | None]] = []

        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                     learning_rate=None):
            self.handed.append((self.state.global_step, learning_rate))
            super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                             start_time, learning_rate=learning_rate)

    args = lib.TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, num_train_epochs=1,
                                 learning_rate=LR, lr_scheduler_type="linear", logging_steps=2, save_strategy="no",
                                 report_to="none", disable_tqdm=True, use_cpu=True, seed=0)
    trainer = Recording(model=SeededRegressor(), args=args, train_dataset=_data()[:steps * 2])
    trainer.handed = []
    trainer.train()
    logged = [(e["step"], e["learning_rate"]) for e in trainer.state.log_history if "learning_rate" in e]
    assert logged == [(s, r) for s, r in trainer.handed if s % 2 == 0][:len(logged)]  # the rate handed is logged
    return trainer.handed


@pytest.mark.slow  # the upstream Trainer: seconds
def test_maybe_log_save_evaluate_is_handed_the_rate_the_step_used_as_upstream(tmp_path):
    """Upstream's loop hands ``learning_rate=`` (read after the optimizer step, before the scheduler's) to
    ``_maybe_log_save_evaluate`` at every step and at the epoch's end; an override that logs it (TRL's
    OnlineDPOTrainer) logged the rate one step late on trainwell, which handed nothing (8.33e-05 at step 1)."""
    import trainwell

    transformers.logging.set_verbosity_error()
    ours = _handed_rates(trainwell, tmp_path / "ours")
    theirs = _handed_rates(transformers, tmp_path / "theirs")
    assert [s for s, _ in ours] == [s for s, _ in theirs] == [1, 2, 3, 4, 5, 6, 6]  # the last: the epoch's end
    assert [r for _, r in ours] == pytest.approx([r for _, r in theirs], rel=1e-12)
    assert ours[0][1] == LR and ours[-1][1] == pytest.approx(LR / 6)


def test_an_override_without_learning_rate_is_still_called(tmp_path):
    """An override written before upstream added ``learning_rate`` (``start_time`` last) keeps working: the loop
    calls it without the rate, and the default logging reads the rate the step used."""
    import trainwell

    calls = []

    class OldSignature(trainwell.Trainer):
        def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                     start_time):
            calls.append(self.state.global_step)
            super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                             start_time)

    args = trainwell.TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=2,
                                       learning_rate=LR, lr_scheduler_type="linear", logging_steps=1,
                                       save_strategy="no", report_to="none", disable_tqdm=True, seed=0)
    trainer = OldSignature(model=SeededRegressor(), args=args, train_dataset=_data()[:4])
    trainer.train()
    assert calls == [1, 2, 2]
    rates = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
    assert rates == pytest.approx([LR, LR / 2])
