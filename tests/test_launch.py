"""``tests/helpers/launch.py``, the helper every test that starts a job uses: its environment, its failures, its
time limit."""

from __future__ import annotations

import os
import sys
import time

import pytest

from helpers.launch import LAUNCH_VARS, ROOT, child_env, run, run_json, start, torchrun, wait


def test_child_env_drops_launcher_variables_and_puts_the_checkout_first(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("MASTER_PORT", "1234")
    monkeypatch.setenv("KEEP_ME", "yes")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = child_env(drop=["KEEP_ME"], DS_ACCELERATOR="cpu")
    assert not set(LAUNCH_VARS) & set(env) and "KEEP_ME" not in env
    assert env["PYTHONPATH"] == os.pathsep.join([str(ROOT), "/elsewhere"])
    assert env["OMP_NUM_THREADS"] == "1" and env["DS_ACCELERATOR"] == "cpu"


@pytest.mark.slow
def test_torchrun_command_runs_two_ranks(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import json, os, sys\n"
                      "open(os.path.join(sys.argv[1], 'rank%s.json' % os.environ['RANK']), 'w').write("
                      "json.dumps({'world': os.environ['WORLD_SIZE']}))\n")
    run(torchrun(script, tmp_path), "the 2-rank job", timeout=300)
    assert run_json([sys.executable, "-c", "pass"], tmp_path / "rank1.json", "nothing", timeout=60) == {"world": "2"}


@pytest.mark.slow
def test_a_failed_job_fails_the_test_with_its_output(tmp_path):
    with pytest.raises(pytest.fail.Exception, match=r"(?s)the job failed with exit code 3:.*BROKEN"):
        run([sys.executable, "-c", "import sys; print('BROKEN'); sys.exit(3)"], "the job", timeout=60)
    done = run([sys.executable, "-c", "import sys; sys.exit(3)"], "the job", timeout=60, check=False)
    assert done.returncode == 3
    with pytest.raises(pytest.fail.Exception, match="the job ended without writing"):
        run_json([sys.executable, "-c", "pass"], tmp_path / "missing.json", "the job", timeout=60)


@pytest.mark.slow
def test_a_job_past_its_time_limit_is_killed_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
            "print('STARTED', flush=True)\n"
            "time.sleep(600)\n")
    proc = start([sys.executable, "-c", code])
    deadline = time.monotonic() + 60
    while not pid_file.is_file() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the job did not start its child"
        time.sleep(0.1)
    grandchild = int(pid_file.read_text())
    with pytest.raises(pytest.fail.Exception, match=r"(?s)the sleeper did not finish in 1s.*STARTED"):
        wait(proc, "the sleeper", timeout=1)
    assert proc.returncode is not None
    for _ in range(100):  # SIGKILL is delivered at once; the kernel may take a moment to reap it
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        if _is_zombie(grandchild):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the job's child {grandchild} outlived the time limit")


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except OSError:
        return False
