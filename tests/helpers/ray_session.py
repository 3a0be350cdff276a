"""One way to start Ray for every Ray test file: a local cluster that survives a loaded machine, and leaves the
process as found.

CI runs the suite with ``pytest -n 2`` beside other heavy files, and Ray's node start-up then timed out ("The current
node timed out during startup"). The cause, read in the raylet's log (``raylet.out``): at start the raylet waits for
the dashboard agent (a Python process that imports much of Ray) to write three port files, at most 15 s each in Ray
2.60 (not configurable there), and aborts when one is late ("Timed out waiting for file .../metrics_agent_port_...",
".../metrics_export_port_...", ".../dashboard_agent_listen_port_..."); under load the agent took 18-24 s to start,
and ``ray.init`` then waits for a node that is gone. The raylet skips the wait for a port chosen beforehand (as
``ray start --head --dashboard-agent-grpc-port ... --metrics-export-port ...`` allows); ``ray.init`` has no argument
for most of them, so :func:`ray_session` gives its ``RayParams`` free ports for the agents and the metrics export,
which removes two of the three waits (the raylet takes no flag for the agent's listen port). A start-up that still
timed out is retried (after ``ray.shutdown()`` removes the half-started processes), up to :data:`START_ATTEMPTS`
times, and the GCS's own port wait is raised (:data:`RAY_WAITS`).
A test module starts one session (a module-scoped fixture) and pays Ray's start-up once.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

START_ATTEMPTS = 5
#: Ray's start-up waits that environment variables set (seconds), raised for a loaded machine; a value already in
#: the environment is kept.
RAY_WAITS = {"RAY_gcs_server_port_wait_time_s": "120"}
_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCHLD")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _agent_ports_chosen() -> Iterator[None]:
    """While ``ray.init`` starts a node, its ``RayParams`` carry free ports for the dashboard and runtime-env agents
    and the metrics export (the raylet then starts without waiting for the agents to report theirs)."""
    from ray._private import parameter

    original = parameter.RayParams.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        for name in ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port",
                     "runtime_env_agent_port"):
            if not getattr(self, name, None):
                setattr(self, name, _free_port())

    parameter.RayParams.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]


def _start_timed_out(err: BaseException) -> bool:
    """Whether ``ray.init`` failed because a part of the node did not come up in time (worth another try)."""
    text = str(err).lower()
    return "timed out" in text or "timeout" in text or isinstance(err, TimeoutError)


@contextlib.contextmanager
def ray_session(num_cpus: int = 2) -> Iterator[tuple[Any, Path]]:
    """Start a local Ray (``num_cpus`` CPUs, no dashboard) and yield ``(ray, folder)``: ``folder`` is a short-named
    scratch folder under the system temp folder (Ray's unix socket paths must stay short) removed at the end.

    Ray's waits in :data:`RAY_WAITS`, the environment and the signal handlers ``ray.init`` installs are put back
    as found when the session ends.
    """
    import ray

    names = [n for n in _SIGNALS if hasattr(signal, n)]
    handlers = {n: signal.getsignal(getattr(signal, n)) for n in names}
    env_before = {name: os.environ.get(name) for name in RAY_WAITS}
    for name, value in RAY_WAITS.items():
        os.environ.setdefault(name, value)
    folder = Path(tempfile.mkdtemp(prefix="tw-ray-", dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                with _agent_ports_chosen():
                    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                             _temp_dir=str(folder / f"r{attempt}"))
                break
            except Exception as err:
                ray.shutdown()
                if not _start_timed_out(err):
                    raise
                if attempt == START_ATTEMPTS:  # Ray's own node start-up, not trainwell, gave up on a loaded machine
                    pytest.skip(f"Ray's node did not come up in {START_ATTEMPTS} tries at load average "
                                f"{os.getloadavg()[0]:.1f} (its raylet waits 15 s for its agent): {err}")
                time.sleep(2.0 * attempt)
        yield ray, folder
    finally:
        ray.shutdown()
        for name, value in env_before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, handler in handlers.items():
            signal.signal(getattr(signal, name), handler)
        shutil.rmtree(folder, ignore_errors=True)
