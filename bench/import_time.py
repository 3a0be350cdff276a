"""Import time: what ``from trainwell import Trainer, TrainingArguments`` adds to ``import torch``.

Each measure is the median of N fresh interpreters (default 5) timing ``import torch`` and then the statement, so
torch's own import (about a second, and noisy) cancels out. Two ways of finding trainwell's code are measured:

* ``cached``: trainwell's compiled bytecode is on disk, as after ``pip install`` (which compiles it) or after the
  first import from a checkout; this is what a user pays. The bytecode goes to a temporary
  ``PYTHONPYCACHEPREFIX``, written by one untimed run first, so the checkout is left as it is.
* ``source``: every trainwell module is compiled from source at each import (``PYTHONDONTWRITEBYTECODE=1`` in a
  checkout without ``__pycache__``, as in this project's development machines); compiling is then most of the time.

    python bench/import_time.py              # both, median of 5
    python bench/import_time.py --repeats 9 --also transformers
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SNIPPET = ("import time; t0 = time.perf_counter(); import torch; t1, c1 = time.perf_counter(), time.process_time(); "
            "{stmt}; t2, c2 = time.perf_counter(), time.process_time(); print(t1 - t0, t2 - t1, c2 - c1)")
STATEMENTS = {
    "trainwell": "from trainwell import Trainer, TrainingArguments",
    "transformers": "from transformers import Trainer, TrainingArguments",
}


def _env(mode: str, cache_dir: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("PYTHONPYCACHEPREFIX", None)
    if mode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = cache_dir
    else:  # torch's installed bytecode is still read (a cache prefix would hide it and compile torch too)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def checkout_has_bytecode() -> bool:
    """Whether the checkout holds compiled trainwell modules (then the ``source`` measure reads them instead)."""
    return any((REPO / "trainwell").rglob("__pycache__/*.pyc"))


def measure(stmt: str, mode: str, repeats: int) -> tuple[float, float, float]:
    """Medians over ``repeats`` interpreters: seconds of ``import torch``, seconds ``stmt`` adds after it, and the
    process CPU seconds it adds (steadier than the wall time on a busy machine)."""
    with tempfile.TemporaryDirectory(prefix="trainwell-pycache-") as cache_dir:
        env = _env(mode, cache_dir)
        if mode == "cached":  # untimed: writes the bytecode of everything the statement imports
            subprocess.run([sys.executable, "-c", _SNIPPET.format(stmt=stmt)], env=env, check=True,
                           capture_output=True, cwd=REPO)
        torch_times, added, cpu = [], [], []
        for _ in range(repeats):
            # run in REPO: `python -c` puts the working directory first on sys.path, and another checkout there
            # would be the trainwell imported
            out = subprocess.run([sys.executable, "-c", _SNIPPET.format(stmt=stmt)], env=env, check=True,
                                 capture_output=True, text=True, cwd=REPO).stdout
            first, second, third = (float(v) for v in out.split()[-3:])
            torch_times.append(first)
            added.append(second)
            cpu.append(third)
    return statistics.median(torch_times), statistics.median(added), statistics.median(cpu)


def main(argv: list[str] | None = None) -> int:
    """Print the median import time added by trainwell (and optionally transformers) in both modes."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters per measure (default 5)")
    parser.add_argument("--also", choices=("transformers",), action="append", default=[],
                        help="also time `from transformers import Trainer, TrainingArguments`")
    ns = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}, median of {ns.repeats} fresh interpreters, python "
          f"{sys.version.split()[0]}")
    if checkout_has_bytecode():
        print("(trainwell/**/__pycache__ holds bytecode: the `source` lines read it; delete it to time compiling)")
    for name in ["trainwell", *ns.also]:
        for mode in ("cached", "source"):
            torch_s, added, cpu = measure(STATEMENTS[name], mode, ns.repeats)
            print(f"{name:<13} {mode:<7} import torch {torch_s:.3f} s, `{STATEMENTS[name]}` adds {added:.4f} s "
                  f"(process CPU {cpu:.4f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
