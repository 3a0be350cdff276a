"""Resuming a finished run to a larger ``max_steps`` lays the learning-rate schedule out again over the new length
(upstream does the same, silently): the resume says so, since a decaying rate rises again at the saved step."""

from __future__ import annotations

import logging

import pytest

from helpers import RegressionModel, regression_data
from trainwell import Trainer, TrainingArguments


def _train(out, caplog, max_steps: int, scheduler: str, resume: bool) -> list[str]:
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4,
                             lr_scheduler_type=scheduler, save_strategy="steps", save_steps=4, report_to="none",
                             disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        trainer.train(resume_from_checkpoint=True if resume else None)
    return [r.getMessage() for r in caplog.records if "learning-rate schedule" in r.getMessage()]


@pytest.mark.parametrize(("scheduler", "warned"), [("linear", True), ("constant", False)])
def test_a_resume_to_a_longer_run_says_the_schedule_is_laid_out_again(tmp_path, caplog, scheduler, warned):
    assert _train(tmp_path, caplog, 4, scheduler, resume=False) == []
    messages = _train(tmp_path, caplog, 8, scheduler, resume=True)
    assert bool(messages) is warned
    if warned:
        assert messages[0].startswith("Resuming at step 4 of a run planned for 4 steps, now planned for 8: the "
                                      "learning-rate schedule (linear) is laid out again over 8 steps")


def test_a_resume_with_the_same_length_says_nothing(tmp_path, caplog):
    _train(tmp_path, caplog, 8, "linear", resume=False)
    # a requeue of the same command line (here at the end: nothing left to train) plans the same length
    assert _train(tmp_path, caplog, 8, "linear", resume=True) == []
