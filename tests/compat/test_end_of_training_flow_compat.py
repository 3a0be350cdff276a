"""What the last step of a run evaluates and saves, against the installed ``transformers.Trainer`` (5.24).

With ``eval_strategy="steps"`` upstream also evaluates the last step when ``max_steps`` is not a multiple of
``eval_steps`` (``DefaultFlowCallback.on_step_end``): a 7-step run evaluating every 3 steps evaluates at 3, 6 and 7,
and ``load_best_model_at_end`` may then pick checkpoint-7 (trainwell evaluated at 3 and 6 only and picked
checkpoint-6). Only the ``steps`` save strategy saves the last step of its own: an ``epoch`` run ending on
``max_steps`` evaluates and saves once, at the epoch's end (trainwell saved there twice, before and after the
evaluation).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import NormalRows
from helpers.models import SeededRegressor

transformers = pytest.importorskip("transformers")

import trainwell  # noqa: E402

transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.slow  # the upstream Trainer: seconds

CASES = {
    # 7 steps, an evaluation and a checkpoint every 3: the best eval_loss is the last step's
    "steps": dict(max_steps=7, eval_strategy="steps", eval_steps=3, save_steps=3, load_best_model_at_end=True),
    # max_steps ends the second epoch early (6 steps an epoch)
    "epoch": dict(max_steps=8, eval_strategy="epoch", save_strategy="epoch", load_best_model_at_end=True),
}


def _run(lib: Any, out: Path, options: dict[str, Any]) -> dict[str, Any]:
    events: list[tuple[str, int]] = []

    class Record(lib.TrainerCallback):
        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            events.append(("evaluate", state.global_step))

        def on_save(self, args, state, control, **kwargs):
            events.append(("save", state.global_step))

    args = lib.TrainingArguments(output_dir=str(out), per_device_train_batch_size=2,
                                 logging_steps=100, report_to="none", disable_tqdm=True, use_cpu=True, seed=0,
                                 **options)
    trainer = lib.Trainer(model=SeededRegressor(), args=args, train_dataset=NormalRows(12),
                          eval_dataset=NormalRows(6), callbacks=[Record()])
    trainer.train()
    state = trainer.state
    return {"events": events,
            "eval_loss": [(e["step"], e["eval_loss"]) for e in state.log_history if "eval_loss" in e],
            "best": os.path.basename(state.best_model_checkpoint or ""), "best_metric": state.best_metric,
            "checkpoints": sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")),
            "weights": torch.cat([p.detach().flatten() for p in trainer.model.parameters()])}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_last_step_is_evaluated_and_saved_as_upstream(case, tmp_path):
    ours = _run(trainwell, tmp_path / "ours", CASES[case])
    theirs = _run(transformers, tmp_path / "theirs", CASES[case])
    assert ours["events"] == theirs["events"]
    assert [s for s, _ in ours["eval_loss"]] == [s for s, _ in theirs["eval_loss"]]
    assert [v for _, v in ours["eval_loss"]] == pytest.approx([v for _, v in theirs["eval_loss"]], rel=1e-6)
    assert ours["best"] == theirs["best"] and ours["best_metric"] == pytest.approx(theirs["best_metric"], rel=1e-6)
    assert ours["checkpoints"] == theirs["checkpoints"]
    torch.testing.assert_close(ours["weights"], theirs["weights"])  # the best model loaded at the end
    if case == "steps":  # what changed: the step-7 evaluation, the best of the run
        assert [s for s, _ in ours["eval_loss"]] == [3, 6, 7] and ours["best"] == "checkpoint-7"
        assert ours["events"] == [("evaluate", 3), ("save", 3), ("evaluate", 6), ("save", 6), ("evaluate", 7),
                                  ("save", 7)]
    else:
        assert ours["events"] == [("evaluate", 6), ("save", 6), ("evaluate", 8), ("save", 8)]
