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
