"""Running one job under transformers and under trainwell side by side, and comparing their ``log_history``.

Each side runs in a process of its own (the patch never leaks into the test process): upstream as
``python JOB ...``; trainwell through one of the two documented routes, ``python -m trainwell run JOB ...`` (the
script unmodified) or ``python JOB ... --patch`` (the script calls ``trainwell.patch_transformers()`` first).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from helpers import launch

JOBS = Path(__file__).resolve().parent / "jobs"
#: log keys that measure time, not training
TIMING_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos")
#: ... and the endings of the other timing keys (eval_runtime, eval_samples_per_second, TRL's step_time...)
TIMING_SUFFIXES = ("_runtime", "_per_second", "_time")


def run_both(job: str, args: list[str], out: Path, *, route: str, timeout: float = 240,
             reads: str = "log_history.json") -> dict[str, Any]:
    """Run ``JOBS/job args... OUT`` upstream and on trainwell at once; returns ``{"upstream": history,
    "trainwell": history, "output": trainwell's output, "folder": {side: out folder}}`` (each side's history is
    the JSON file ``reads`` in its out folder)."""
    script = str(JOBS / job)
    folders = {"upstream": out / "upstream", "trainwell": out / "trainwell"}
    commands = {"upstream": [sys.executable, script, *args, str(folders["upstream"])]}
    if route == "run":
        commands["trainwell"] = [sys.executable, "-m", "trainwell", "run", script, *args, str(folders["trainwell"])]
    elif route == "patch":
        commands["trainwell"] = [sys.executable, script, *args, str(folders["trainwell"]), "--patch"]
    else:
        raise ValueError(f"route={route!r}: use 'run' or 'patch'")
    procs = {side: launch.start(cmd) for side, cmd in commands.items()}
    done = {side: launch.wait(proc, f"{job} {' '.join(args)} ({side})", timeout=timeout)
            for side, proc in procs.items()}
    result: dict[str, Any] = {side: json.loads((folders[side] / reads).read_text()) for side in folders}
    result["output"] = done["trainwell"].stdout
    result["folder"] = folders
    return result


def largest_difference(upstream: list[dict], ours: list[dict], *, last_step: int | None = None) -> float:
    """The largest relative difference of any logged number (timings aside) over the entries up to ``last_step``;
    the entries must log the same keys at the same steps."""
    if last_step is not None:
        upstream = [e for e in upstream if e["step"] <= last_step]
        ours = [e for e in ours if e["step"] <= last_step]
    assert [sorted(e) for e in ours] == [sorted(e) for e in upstream], "the logs differ in their entries or keys"
    worst = 0.0
    for theirs, mine in zip(upstream, ours):
        for key, value in theirs.items():
            if key in TIMING_KEYS or key.endswith(TIMING_SUFFIXES) or not isinstance(value, (int, float)):
                continue
            other = mine[key]
            if value == other:
                continue
            worst = max(worst, math.inf if value == 0 else abs(other - value) / abs(value))
    return worst


def final_weights_difference(a: Path, b: Path) -> float:
    """The largest absolute difference between two ``model.safetensors`` (same keys)."""
    from safetensors.torch import load_file

    first, second = load_file(str(a)), load_file(str(b))
    assert sorted(first) == sorted(second)
    return max((first[k].double() - second[k].double()).abs().max().item() for k in first)
