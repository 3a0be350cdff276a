"""Two Ctrl-C 0.1 s apart: the first asks for a checkpoint and a stop, the second leaves at once. The command still
names the newest complete checkpoint and the command that resumes, and leaves no temporary folder behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.launch import child_env

from trainwell.checkpoint import layout


@pytest.mark.slow
def test_two_ctrl_c_name_the_newest_checkpoint_and_leave_no_temporary_folder(tmp_path):
    out = tmp_path / "run"
    env = child_env(drop=["TRAINWELL_DEBUG"])
    argv = ["--output_dir", str(out), "--max_steps", "100000", "--save_steps", "3", "--eval_strategy", "no",
            "--logging_steps", "50"]
    proc = subprocess.Popen([sys.executable, "-m", "trainwell", "train", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
        while not layout.list_complete_checkpoints(out) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert layout.list_complete_checkpoints(out), "no checkpoint was written"
        proc.send_signal(signal.SIGINT)
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    newest = layout.list_complete_checkpoints(out)[-1]
    last = stderr.strip().splitlines()[-1]
    # the second Ctrl-C came during the run ("interrupted; newest complete checkpoint ...") or after its checkpoint
    # was saved ("preempted by SIGINT at step N, checkpoint ..."): either way the last line says where to go on from
    assert last.startswith(("trainwell: interrupted; newest complete checkpoint", "trainwell: preempted by SIGINT"))
    assert str(newest) in last, last
    assert "resume with: trainwell train" in last and "--resume_from_checkpoint auto" in last
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert "Traceback" not in stderr
