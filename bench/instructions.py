"""CPU instructions per optimizer step of the hand loop and of trainwell (``valgrind --tool=callgrind``).

The timing of ``bench/overhead.py`` needs an idle machine; an instruction count does not: each runner of
``bench/overhead.py`` trains the same MLP for a short and a long run under callgrind, and the difference over the extra
steps is what one optimizer step executes (Python, torch's C++ and the kernels alike; start-up and set-up cancel).
The default split is 40 and 80 steps: with 20 and 60 a one-off cost landed in trainwell's short run only
(2026-11-29: 4.4 M per step against 6.3 M with 40/80, with the same torch operators per step).

    python bench/instructions.py                    # 40 and 80 steps, both runners (minutes: valgrind is slow)
    python bench/instructions.py --steps 10 30
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_RUN = ("import importlib.util, sys, tempfile, torch; torch.set_num_threads(1); "
        "spec = importlib.util.spec_from_file_location('b', sys.argv[1]); b = importlib.util.module_from_spec(spec); "
        "sys.modules['b'] = b; spec.loader.exec_module(b); data = b.ToyDataset(2048, 0); "
        "cfg = b.BenchConfig(steps=int(sys.argv[3]), warmup_steps=2); "
        "d = tempfile.mkdtemp(); getattr(b, sys.argv[2])(cfg, data, b.fresh_model(0), d)")


def instructions(runner: str, steps: int) -> int:
    """Instructions (callgrind's ``Ir``) of one process training ``steps`` steps with ``runner`` (a function name of
    ``bench/overhead.py``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable,
                               "-c", _RUN, str(REPO / "bench" / "overhead.py"), runner, str(steps)],
                              capture_output=True, text=True, env=env, check=True)
    found = re.findall(r"Collected : (\d+)", proc.stderr)
    if not found:
        raise RuntimeError(f"callgrind printed no total:\n{proc.stderr[-2000:]}")
    return int(found[-1])


def main(argv: list[str] | None = None) -> int:
    """Print the instructions per optimizer step of both runners and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs=2, default=(40, 80), metavar=("SHORT", "LONG"))
    ns = parser.parse_args(argv)
    short, long = ns.steps
    per_step = {}
    for runner in ("run_hand", "run_trainwell"):
        per_step[runner] = (instructions(runner, long) - instructions(runner, short)) / (long - short)
    hand, ours = per_step["run_hand"], per_step["run_trainwell"]
    print(f"CPU instructions per optimizer step (callgrind, {long} - {short} steps): hand loop {hand / 1e6:.3f} M, "
          f"trainwell {ours / 1e6:.3f} M, ratio (hand / trainwell) {hand / ours:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
