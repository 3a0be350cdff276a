"""DeepSpeed's CPU op, compiled once per test session before the first test that launches DeepSpeed.

DeepSpeed compiles its CPU Adam op (``cpu_adam``) on first use: minutes of CPU, longer on a busy machine. Inside a
test's job that build ran against the job's time limit; killed there, it left torch's build lock behind and every
later DeepSpeed job waited on it. Here the build runs alone, in its own process session with its own generous
limit; on a timeout or an interrupt the whole session is killed and the build locks it held are removed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .launch import _kill, _tail, child_env, start

#: The build's own limit (the first build took about 2 minutes on an idle 2-core machine, over 5 at a load of 10).
BUILD_TIMEOUT_S = 1500.0
_BUILD = "from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load(verbose=False)"


def build_cpu_adam(timeout: float = BUILD_TIMEOUT_S) -> None:
    """Compile (or load, when already built) DeepSpeed's ``cpu_adam`` op into ``TORCH_EXTENSIONS_DIR``."""
    proc = start([sys.executable, "-c", _BUILD], env=child_env(DS_ACCELERATOR="cpu"))
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except BaseException as err:  # a timeout, Ctrl-C or pytest-timeout: no build process and no lock left behind
        held = locks_held_by_session(proc.pid)
        _kill(proc)
        stdout, _ = proc.communicate()
        for lock in held:
            lock.unlink(missing_ok=True)
        if isinstance(err, subprocess.TimeoutExpired):
            pytest.fail(f"building DeepSpeed's cpu_adam op took over {timeout:.0f}s (killed; its build locks "
                        f"removed: {[str(lock) for lock in held]}):\n{_tail(stdout, None)}")
        raise
    if proc.returncode != 0:
        pytest.fail(f"building DeepSpeed's cpu_adam op failed (exit {proc.returncode}):\n{_tail(stdout, None)}")


def locks_held_by_session(session: int, proc: Path = Path("/proc")) -> list[Path]:
    """The torch build locks (``<op>/lock`` files) that processes of ``session`` hold open: torch's ``FileBaton``
    keeps its lock file open from creation to release, so these, and only these, are the killed build's own (a lock
    of another worker's build is never taken for ours)."""
    held = set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) != session:
                continue
            for fd in (entry / "fd").iterdir():
                target = Path(os.readlink(fd))
                if target.name == "lock":
                    held.add(target)
        except (OSError, IndexError, ValueError):  # the process ended meanwhile
            continue
    return sorted(held)
