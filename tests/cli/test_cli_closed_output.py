"""``trainwell train ... | head -3``: the reader leaving does not cost the run (it used to end with exit status 141,
no checkpoint and nothing more in train.log)."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest
from helpers.launch import child_env

from trainwell.cli.closed_output import output_may_close


@pytest.mark.slow
@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout+stderr"])
def test_a_run_piped_into_head_trains_to_the_end(tmp_path, both):
    out = tmp_path / "run"
    env = child_env(drop=["TRAINWELL_DEBUG"])
    command = (f"{sys.executable} -m trainwell train --max_steps 30 --save_steps 15 --eval_steps 15 "
               f"--logging_steps 1 --per_device_eval_batch_size 64 --output_dir {out}"
               f"{' 2>&1' if both else ''} | head -3; exit ${{PIPESTATUS[0]}}")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(result.stdout.splitlines()) <= 3  # head took its lines and left
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 30
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-15", "checkpoint-30"]
    assert (out / "model.safetensors").is_file()
    assert "training ended at step 30" in (out / "train.log").read_text()


class _PipeWithNoReader(io.StringIO):
    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def fileno(self):
        raise io.UnsupportedOperation("no file descriptor")


def test_writes_after_the_reader_left_are_dropped_and_the_streams_are_restored(monkeypatch):
    gone, kept = _PipeWithNoReader(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", gone)
    monkeypatch.setattr(sys, "stderr", kept)
    with output_may_close():
        print("first line")  # the reader left: no error
        print("second line")
        print("to stderr", file=sys.stderr)
        assert sys.stdout.closed_by_reader and not sys.stderr.closed_by_reader
    assert sys.stdout is gone and sys.stderr is kept
    assert kept.getvalue() == "to stderr\n"


@pytest.mark.slow
def test_resuming_a_run_already_past_max_steps_trains_nothing_and_keeps_its_files(tmp_path):
    out = tmp_path / "run"
    env = child_env(drop=["TRAINWELL_DEBUG"])
    base = [sys.executable, "-m", "trainwell", "train", "--output_dir", str(out), "--save_steps", "6",
            "--eval_steps", "6", "--logging_steps", "1", "--per_device_eval_batch_size", "64"]
    first = subprocess.run([*base, "--max_steps", "6"], capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    kept = {name: (out / name).read_bytes() for name in ("train_results.json", "trainer_state.json",
                                                         "model.safetensors", "all_results.json")}
    again = subprocess.run([*base, "--max_steps", "2", "--resume_from_checkpoint", "auto"], capture_output=True,
                           text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "is already at step 6, at or past --max_steps 2: nothing to train" in again.stderr
    assert "training:" not in again.stderr  # no run started
    assert {name: (out / name).read_bytes() for name in kept} == kept
