"""A real Ctrl-C to ``trainwell train`` on a terminal: each message starts on its own line
(none glued to the progress bar), the CLI gives its own resume command (not the Python API's), and train.log
reports the speed of the steps that ran."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from helpers.launch import ROOT

REPO = ROOT


def _on_a_terminal(argv: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``trainwell`` with a pseudo-terminal (80 columns) as its stdout and stderr; send SIGINT once its
    progress bar has been redrawn a few times; return the exit status and everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    env.pop("TRAINWELL_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "trainwell", *argv], stdin=slave, stdout=slave, stderr=slave,
                            cwd=cwd, env=env, start_new_session=True)
    os.close(slave)
    output, sent = b"", False
    deadline = time.monotonic() + 300  # a hang guard, not a timing assertion
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if not sent and output.count(b"it/s]") > 5:
                proc.send_signal(signal.SIGINT)
                sent = True
        else:
            pytest.fail(f"trainwell did not stop:\n{output[-3000:].decode(errors='replace')}")
        return proc.wait(timeout=60), output.decode(errors="replace")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(master)


@pytest.mark.slow
def test_ctrl_c_on_a_terminal_prints_one_clean_block_with_the_cli_hint(tmp_path):
    argv = ["train", "--output_dir", "out", "--max_steps", "100000", "--save_steps", "100000", "--eval_strategy",
            "no", "--per_device_train_batch_size", "2", "--logging_steps", "100000"]
    status, output = _on_a_terminal(argv, tmp_path)
    assert status == 130, output[-3000:]
    lines = [line.split("\r")[-1] if not line.endswith("\r") else line.rstrip("\r").split("\r")[-1]
             for line in output.split("\n")]
    messages = [line for line in lines if "SIGINT" in line]
    assert len(messages) == 3, messages  # received, preempted (the log), the CLI's resume line
    assert messages[0].startswith("received SIGINT: will save a checkpoint")
    assert messages[1].startswith("Training preempted by SIGINT at step ")
    assert messages[2].startswith("trainwell: preempted by SIGINT at step ")
    assert messages[2].endswith("--resume_from_checkpoint auto")
    for raw in output.split("\n"):  # no message shares its terminal line with the bar
        if "SIGINT" in raw:
            assert "it/s]" not in raw, raw
    assert "train(resume_from_checkpoint=True)" not in output  # the Python API's hint is not the CLI's
    step = int(messages[1].split("at step ")[1].split(":")[0])
    logged = [json.loads(line[line.index("{"):]) for line in (tmp_path / "out" / "train.log").read_text()
              .splitlines() if '"train_runtime"' in line]
    speed = logged[-1]
    # the steps and samples this run made, not the 100000 planned
    assert speed["train_steps_per_second"] * speed["train_runtime"] == pytest.approx(step, rel=0.02)
    assert speed["train_samples_per_second"] * speed["train_runtime"] == pytest.approx(2 * step, rel=0.02)
