"""Acceptance of bit-exact resume: a job killed (SIGKILL, also mid-save) or preempted (SIGTERM) and resumed ends
with exactly the weights and the per-step logs of the same job run without interruption.

Every run is a subprocess of ``tests/checkpoint/resume_job.py`` (dropout on, shuffling on, gradient accumulation 2,
linear warmup+decay, AdamW, 3 epochs of 6 optimizer steps, a checkpoint and an evaluation every 3 steps).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

JOB = Path(__file__).with_name("resume_job.py")
TOTAL_STEPS = 18
TIMING_KEYS = ("runtime", "per_second")


def run_job(output_dir: Path, *flags: str | int, expect: int = 0) -> subprocess.CompletedProcess:
    """Run the job once; assert its exit status (``-SIGKILL`` for a run that kills itself)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, str(JOB), str(output_dir), *map(str, flags)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == expect, f"exit {proc.returncode}, expected {expect}:\n{proc.stderr[-3000:]}"
    return proc


def read_result(output_dir: Path) -> dict:
    return json.loads((output_dir / "result.json").read_text())


def comparable_logs(output_dir: Path) -> list[dict]:
    """``log_history`` without the wall-clock entries (runtimes, throughputs)."""
    history = json.loads((output_dir / "log_history.json").read_text())
    return [{k: v for k, v in entry.items() if not any(t in k for t in TIMING_KEYS)} for entry in history]


def load_final(output_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(output_dir / "final.safetensors"))


def assert_same_run(reference: Path, resumed: Path) -> None:
    """Weights equal bit for bit; every log entry (loss, learning_rate, grad_norm, eval_loss, epoch) identical."""
    expected, got = load_final(reference), load_final(resumed)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"weight {name} differs after resume"
    logs_a, logs_b = comparable_logs(reference), comparable_logs(resumed)
    steps = [e["step"] for e in logs_a if "loss" in e]
    assert steps == list(range(1, TOTAL_STEPS + 1))
    assert len(logs_a) == len(logs_b)
    for entry_a, entry_b in zip(logs_a, logs_b):
        assert entry_a == entry_b, f"log of step {entry_a.get('step')} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run A: the uninterrupted job."""
    out = tmp_path_factory.mktemp("uninterrupted")
    run_job(out)
    result = read_result(out)
    assert result == {"preempted": False, "global_step": TOTAL_STEPS, "getitem_calls": 3 * 44}
    return out


@pytest.mark.slow
def test_sigkill_including_mid_save_resumes_bit_exact(reference: Path, tmp_path: Path) -> None:
    run_job(tmp_path, "--kill-at-step", 5, expect=-signal.SIGKILL)
    # the killed run's output_dir lock stays behind (taken over by the next run: its process is dead)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".trainwell.lock", "checkpoint-3"]
    run_job(tmp_path, "--resume", "--kill-in-save", 9, expect=-signal.SIGKILL)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != ".trainwell.lock")
    assert "checkpoint-9" not in names and any(n.startswith(".tmp-checkpoint-9-") for n in names), names
    proc = run_job(tmp_path, "--resume", "--kill-at-step", 14, expect=-signal.SIGKILL)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != ".trainwell.lock")
    assert not any(n.startswith(".tmp-") for n in names), names  # the half-written checkpoint was cleaned up
    assert names == ["checkpoint-12", "checkpoint-9"]  # save_total_limit=2; 9 rewritten after the crash
    assert "Removed incomplete checkpoint folders" in proc.stderr
    assert "taking over the lock" in proc.stderr and "no longer running" in proc.stderr
    run_job(tmp_path, "--resume")
    assert read_result(tmp_path)["global_step"] == TOTAL_STEPS
    assert_same_run(reference, tmp_path)


@pytest.mark.slow
def test_sigkill_at_seeded_random_steps_resumes_bit_exact(reference: Path, tmp_path: Path) -> None:
    kill_steps = sorted(random.Random(2).sample(range(1, TOTAL_STEPS + 1), 3))  # [2, 3, 17]: before any save too
    for i, step in enumerate(kill_steps):
        run_job(tmp_path, *(["--resume"] if i else []), "--kill-at-step", step, expect=-signal.SIGKILL)
    run_job(tmp_path, "--resume")
    assert_same_run(reference, tmp_path)


@pytest.mark.slow
def test_sigterm_preemption_saves_stops_and_resumes_bit_exact(reference: Path, tmp_path: Path) -> None:
    proc = run_job(tmp_path, "--term-at-step", 7, expect=143)  # the status SIGTERM gives a script
    # one epoch, step 7's two micro-batches of 4, and the batch the loader holds ahead (as upstream's, accelerate's)
    assert read_result(tmp_path) == {"preempted": True, "global_step": 7, "getitem_calls": 44 + 8 + 4}
    assert (tmp_path / "checkpoint-7" / ".complete").is_file()  # 7 is not a save step: saved for the preemption
    assert "preempted by SIGTERM at step 7" in proc.stderr and str(tmp_path / "checkpoint-7") in proc.stderr
    assert not (tmp_path / "final.safetensors").exists()
    # Step 12 is a save step and the end of an epoch: no second save, and the resume seeks past the epoch.
    run_job(tmp_path, "--resume", "--term-at-step", 12, expect=143)
    assert read_result(tmp_path) == {"preempted": True, "global_step": 12, "getitem_calls": 44 - 8}
    run_job(tmp_path, "--resume")
    result = read_result(tmp_path)
    assert result == {"preempted": False, "global_step": TOTAL_STEPS, "getitem_calls": 44}
    assert_same_run(reference, tmp_path)
