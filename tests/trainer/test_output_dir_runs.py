"""Runs sharing one output_dir (``trainwell/trainer/checkpointing/output_dir_runs.py``): a fresh run trains into a
finished run's folder as upstream, its checkpoints count as newer than the earlier run's (rotation, resume,
get_last_checkpoint), and the earlier run loses nothing before this run's newer checkpoint is complete. Upstream
parity: test_output_dir_reuse.py."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

import torch

from helpers import RegressionModel, regression_data, train_until_preempted
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.trainer_utils import get_last_checkpoint


def _trainer(out: Path, max_steps: int, **kwargs) -> Trainer:
    torch.manual_seed(0)
    kwargs.setdefault("save_steps", 3)
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4,
                             report_to="none", disable_tqdm=True, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(32))


def _digests(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_overwrite_output_dir_starts_over_and_rotation_keeps_the_new_runs_checkpoint(tmp_path):
    out = tmp_path / "R"
    _trainer(out, 6).train()
    second = _trainer(out, 2, save_steps=1, save_total_limit=1, overwrite_output_dir=True)
    second.train()
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert get_last_checkpoint(str(out)).endswith("checkpoint-2")
    assert second._tw_checkpoints.of_this_run() == out / "checkpoint-2"


def test_overwrite_output_dir_never_deletes_another_tools_checkpoint(tmp_path):
    out = tmp_path / "R"
    _trainer(out, 6).train()
    foreign = out / "checkpoint-40"
    foreign.mkdir(parents=True)
    (foreign / "model.safetensors").write_bytes(b"not trainwell's")
    _trainer(out, 2, overwrite_output_dir=True, save_steps=1).train()
    assert (foreign / "model.safetensors").read_bytes() == b"not trainwell's"
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-40"]


class _CtrlCAt(TrainerCallback):
    """A real SIGINT to this process at the end of ``step`` (what Ctrl-C sends)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_after_going_back_to_an_older_checkpoint_ctrl_c_names_this_runs_checkpoint(tmp_path, caplog):
    """The first run leaves checkpoint-3 and checkpoint-6; the second resumes checkpoint-3 and is stopped by Ctrl-C at
    step 4. Its checkpoint-4 survives rotation (limit 1, though checkpoint-6 is newer), and the advice names
    checkpoint-4 by its path: ``resume_from_checkpoint=True`` would take the abandoned checkpoint-6."""
    out = tmp_path / "R"
    _trainer(out, 6).train()
    second = _trainer(out, 20, save_steps=100, save_total_limit=1)
    second.add_callback(_CtrlCAt(4))
    with caplog.at_level("WARNING", logger="trainwell"):
        train_until_preempted(second, resume_from_checkpoint=str(out / "checkpoint-3"))
    assert second.preempted and second.state.global_step == 4
    assert (out / "checkpoint-4").is_dir()
    advice = [r.getMessage() for r in caplog.records if "preempted" in r.getMessage()]
    assert advice and f"resume_from_checkpoint={str(out / 'checkpoint-4')!r}" in advice[0], advice


def test_resume_true_names_the_checkpoint_it_takes(tmp_path, caplog):
    out = tmp_path / "R"
    _trainer(out, 6).train()
    with caplog.at_level("WARNING", logger="trainwell"):
        _trainer(out, 7).train(resume_from_checkpoint=True)
    assert f"resume_from_checkpoint=True: resuming from {out / 'checkpoint-6'}" in caplog.text


def test_a_run_that_saves_no_checkpoint_may_share_the_folder(tmp_path):
    out = tmp_path / "R"
    _trainer(out, 6).train()
    before = {p.name for p in out.glob("checkpoint-*")}
    _trainer(out, 2, save_strategy="no").train()
    assert {p.name for p in out.glob("checkpoint-*")} == before
