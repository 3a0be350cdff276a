"""Launching a test's job in child processes: ``torchrun`` with 2 ranks (gloo, CPU), ``accelerate launch`` or one
plain process, all with the same clean environment, and waiting for them with a time limit.

The environment: the test process's own, without the launcher variables a job must not inherit (a job started by a
test is never part of the test's process group), the repository first on ``PYTHONPATH`` (the children import this
checkout's trainwell) and one OpenMP thread per process (the machines running the suite are small).

A job that outlives its time limit is killed with every process it started (its ranks included: a child runs in a
session of its own) and fails the test with the tail of its output; so does a job that exits with an error, unless
the test asked for the exit status itself (``check=False``).

Imported as ``helpers.launch`` (pytest puts ``tests/`` on ``sys.path``: ``tests/conftest.py`` lives there).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

import pytest

__all__ = ["LAUNCH_VARS", "ROOT", "child_env", "dead_pid", "free_port", "run", "run_json", "start", "torchrun", "wait"]

ROOT = Path(__file__).resolve().parents[2]
# What torchrun, the DeepSpeed launcher, srun and mpirun set: a child that inherits one would join the wrong group.
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
               "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "OMPI_COMM_WORLD_SIZE")
TAIL = 6000  # characters of a failed job's output shown in the failure


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for ``--master_port`` or ``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dead_pid() -> int:
    """The pid of a process that has exited (what a killed trainer leaves in its lock and temporary folder names)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def child_env(*, drop: Iterable[str] = (), **extra: str) -> dict[str, str]:
    """The environment of a job: this process's without :data:`LAUNCH_VARS` (nor the names in ``drop``), the
    repository first on ``PYTHONPATH``, ``OMP_NUM_THREADS=1``, then ``extra`` (which may override any of them)."""
    removed = {*LAUNCH_VARS, *drop}
    env = {k: v for k, v in os.environ.items() if k not in removed}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def torchrun(script: str | Path, *args: str | Path, nproc: int = 2, flags: Sequence[str] = ()) -> list[str]:
    """The command running ``script args...`` on ``nproc`` local ranks (rendezvous on a free port of 127.0.0.1);
    ``flags`` are more torchrun options (``--tee=3``)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", *flags, str(script), *map(str, args)]


def start(cmd: Sequence[str | Path], *, env: dict[str, str] | None = None, merge: bool = True,
          cwd: str | Path = ROOT) -> subprocess.Popen:
    """Start ``cmd`` (in ``cwd``, the repository by default) with ``env`` (default :func:`child_env`), capturing its
    output as text: stderr into stdout with ``merge`` (the lines interleaved as printed), else apart."""
    return subprocess.Popen([str(part) for part in cmd], cwd=str(cwd), env=child_env() if env is None else env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE, text=True,
                            start_new_session=True)


def wait(proc: subprocess.Popen, what: str, *, timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    """Wait for ``proc`` at most ``timeout`` seconds; return its exit status and output (``stderr`` is ``""`` when
    merged into ``stdout``). Fails the test, with the tail of the output, when it runs longer (it is killed with all
    its processes) or, with ``check``, when it exits with an error; ``what`` names the job in the failure."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout}s (a hang?):\n{_tail(stdout, stderr)}")
    except BaseException:  # an interrupted test leaves no ranks behind
        _kill(proc)
        raise
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr or "")
    if check and proc.returncode != 0:
        pytest.fail(f"{what} failed with exit code {proc.returncode}:\n{_tail(stdout, stderr)}")
    return done


def run(cmd: Sequence[str | Path], what: str, *, timeout: float, env: dict[str, str] | None = None,
        merge: bool = True, check: bool = True, cwd: str | Path = ROOT) -> subprocess.CompletedProcess:
    """:func:`start` then :func:`wait`."""
    return wait(start(cmd, env=env, merge=merge, cwd=cwd), what, timeout=timeout, check=check)


def run_json(cmd: Sequence[str | Path], result: Path, what: str, *, timeout: float,
             env: dict[str, str] | None = None) -> Any:
    """:func:`run` (checked), then the JSON the job wrote to ``result``; a job that ended well but wrote no result
    fails the test with the tail of its output."""
    done = run(cmd, what, timeout=timeout, env=env)
    if not result.is_file():
        pytest.fail(f"{what} ended without writing {result}:\n{_tail(done.stdout, done.stderr)}")
    return json.loads(result.read_text())


def one_and_two_ranks(script: Path, out: Path, *, timeout: float) -> dict[int, Any]:
    """Run ``script OUT`` as one plain process (``out/one``) and under torchrun on 2 ranks (``out/two``) side by
    side; ``{1: ..., 2: ...}``, the JSON each wrote to ``results_{world}.json`` (the ground truth: two ranks
    equal one)."""
    procs = {2: start(torchrun(script, out / "two")), 1: start([sys.executable, script, out / "one"])}
    for world, proc in procs.items():
        wait(proc, f"the {world}-process job", timeout=timeout)
    return {1: json.loads((out / "one" / "results_1.json").read_text()),
            2: json.loads((out / "two" / "results_2.json").read_text())}


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the job and every process it started: its session (the child was started in one of its own) and
    every descendant, found before the first kill. A process group is not enough: ninja runs each compiler of a
    DeepSpeed op build in a group of its own, and those outlived a killed build."""
    for pid in [proc.pid, *_session_and_descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _session_and_descendants(root: int, proc_dir: Path = Path("/proc")) -> list[int]:
    """The processes of session ``root`` and the descendants of process ``root`` (read from ``/proc``)."""
    parents: dict[int, int] = {}
    found = set()
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        if int(fields[3]) == root:
            found.add(pid)
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in found]
        found.update(children)
        frontier.extend(children)
    found.discard(root)
    return sorted(found)


def _tail(stdout: str | None, stderr: str | None) -> str:
    return ((stdout or "") + (stderr or ""))[-TAIL:]
