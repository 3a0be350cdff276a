"""A second run into a used output_dir: the CLI refuses a fresh run into another run's folder,
``--overwrite_output_dir`` starts over and says so, and a summary names only checkpoints this run wrote or resumed
from. In Python, a fresh ``train()`` there warns and reports only its own checkpoints."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainwell import Trainer, TrainingArguments
from helpers.launch import ROOT

REPO = ROOT
TINY = ["--eval_steps", "2", "--save_steps", "2", "--logging_steps", "1", "--per_device_train_batch_size", "4",
        "--per_device_eval_batch_size", "64"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    env.pop("TRAINWELL_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "trainwell", "train", *argv, *TINY], capture_output=True, text=True,
                          env=env, timeout=600)


def _summary_checkpoint(stdout: str) -> str:
    """The summary's checkpoint row (a long path is wrapped over several lines: joined back without spaces)."""
    flat = "".join(stdout.split())
    return flat.split("checkpoint", 1)[1].split("modelsavedto", 1)[0]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_a_fresh_cli_run_into_a_used_folder_is_refused_and_overwrite_starts_over(tmp_path):
    out = tmp_path / "R"
    first = _cli("--output_dir", str(out), "--max_steps", "4")
    assert first.returncode == 0, first.stderr
    assert _summary_checkpoint(first.stdout) == str(out / "checkpoint-4")
    model = _digest(out / "model.safetensors")

    again = _cli("--output_dir", str(out), "--max_steps", "2")  # a fresh run into the finished one
    assert again.returncode == 2 and "Traceback" not in again.stderr
    line = again.stderr.strip()
    assert line.count("\n") == 0 and line.startswith(f"trainwell: error: --output_dir {out} already holds another run")
    assert "--resume_from_checkpoint auto" in line and "--overwrite_output_dir" in line and "checkpoint-4" in line
    assert _digest(out / "model.safetensors") == model  # nothing of the first run was touched
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    (out / "training_curves.png").write_bytes(b"\x89PNG old run's curves")  # what `trainwell plot` left
    over = _cli("--output_dir", str(out), "--max_steps", "2", "--overwrite_output_dir")
    assert over.returncode == 0, over.stderr
    assert f"trainwell: --overwrite_output_dir: starting over in {out}" in over.stderr
    assert _summary_checkpoint(over.stdout) == str(out / "checkpoint-2")  # its own, never checkpoint-4
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (out / "training_curves.png").exists()  # the old run's plot went with it
    assert "checkpoint-4" not in (out / "train.log").read_text() + (out / "trainer_state.json").read_text()

    resumed = _cli("--output_dir", str(out), "--max_steps", "3", "--save_steps", "3", "--eval_steps", "3",
                   "--resume_from_checkpoint", "auto", "--log_level", "info")
    assert resumed.returncode == 0, resumed.stderr
    assert _summary_checkpoint(resumed.stdout) == str(out / "checkpoint-3")


def _trainer(out: Path, max_steps: int, **kwargs) -> Trainer:
    from helpers import RegressionModel, regression_data

    torch.manual_seed(0)
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4, save_steps=2,
                             report_to="none", disable_tqdm=True, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16))


def test_a_fresh_python_run_next_to_an_earlier_one_warns_and_reports_only_its_own(tmp_path, caplog):
    out = tmp_path / "R"
    _trainer(out, 6).train()
    trainer = _trainer(out, 2, save_strategy="no")
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        trainer.train()
    assert "holds another run's checkpoints (checkpoint-2, checkpoint-4, checkpoint-6); this run saves none" \
        in caplog.text
    assert "train(resume_from_checkpoint=True)" in caplog.text
    assert trainer._tw_checkpoints.of_this_run() is None  # checkpoint-6 is not this run's
    assert trainer.state.best_model_checkpoint is None

    resumed = _trainer(out, 8)
    resumed.train(resume_from_checkpoint=True)
    assert resumed._tw_checkpoints.of_this_run() == out / "checkpoint-8"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainwell"):
        again = _trainer(out, 8)
        again.train(resume_from_checkpoint=str(out / "checkpoint-8"))  # nothing left to train: resumed from
    assert again._tw_checkpoints.of_this_run() == out / "checkpoint-8"
    assert "another run" not in caplog.text


_HOLD_LOCK = """
import sys
from trainwell.checkpoint.lock import OutputDirLock
lock = OutputDirLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.readline()  # held until the test closes our stdin
lock.release()
"""


@pytest.mark.slow
def test_the_cli_never_deletes_a_live_runs_checkpoints_and_names_that_run(tmp_path):
    """Another process holds output_dir's lock (a live run): ``--overwrite_output_dir`` removes nothing and says which
    process holds the folder; so does the refusal without the flag (which then does not advise the flag)."""
    out = tmp_path / "R"
    _trainer(out, 4).train()
    before = {str(p.relative_to(out)): _digest(p) for p in sorted(out.rglob("*")) if p.is_file()}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(out)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        over = _cli("--output_dir", str(out), "--max_steps", "2", "--overwrite_output_dir")
        plain = _cli("--output_dir", str(out), "--max_steps", "2")
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    for done in (over, plain):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"pid {holder.pid} on host" in done.stderr and "a live run is training there" in done.stderr
        assert "removed" not in done.stderr.replace("nothing was removed", "")
    assert "--overwrite_output_dir (removes" not in plain.stderr
    after = {str(p.relative_to(out)): _digest(p) for p in sorted(out.rglob("*")) if p.is_file()}
    assert after == before  # every checkpoint of the live run is still there, byte for byte
