"""Record the v4 goldens: every example case run once with transformers 4.47 (the release of the API the seeds
document), its results written to ``goldens_v4/<case>.json``. The tests compare trainwell's runs of the same
command lines with these files (``test_examples_v4.py``).

Run it in a separate virtual environment holding transformers 4.47 (the installed torch and the rest can be shared):

    python3.11 -m venv /work/venv-v4
    echo /work/venv/lib/python3.11/site-packages > /work/venv-v4/lib/python3.11/site-packages/zz_base.pth
    /work/venv-v4/bin/pip install --no-deps "transformers==4.47.1" "tokenizers>=0.21,<0.22" "huggingface-hub<1.0" \\
        "datasets==3.2.0" "fsspec[http]<=2024.9.0"
    USE_TF=0 /work/venv-v4/bin/python tests/compat/examples/record_v4_goldens.py

(the ``.pth`` line puts the main environment's packages after the venv's own, so 4.47 and its pins win; with the
main environment's datasets 5.x, huggingface-hub 0.x does not import). Each golden records the versions it was made
with, the command line (paths as ``{world}`` / ``{out}``) and the fingerprints of the starting weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import examples_cases as cases  # noqa: E402
import examples_world  # noqa: E402

# name -> (case, extra arguments)
GOLDEN_RUNS = {**{name: (name, []) for name in cases.CASES}, "glue_accumulation": cases.ACCUMULATION}


def _versions() -> dict[str, str]:
    import datasets
    import tokenizers
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__, "tokenizers": tokenizers.__version__,
            "datasets": datasets.__version__, "python": sys.version.split()[0]}


def main() -> None:
    """Build the world, run every golden case with transformers, write ``goldens_v4/``."""
    import transformers

    if not transformers.__version__.startswith("4."):
        raise SystemExit(f"record_v4_goldens.py needs transformers 4.x (found {transformers.__version__}): run it "
                         "in the v4 venv (see this file's docstring)")
    only = set(sys.argv[1:])
    cases.GOLDENS.mkdir(exist_ok=True)
    env = dict(os.environ, USE_TF="0", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as tmp:
        world = Path(tmp) / "world"
        fingerprints = examples_world.build(world)
        for name, (case, extra) in GOLDEN_RUNS.items():
            if only and name not in only:
                continue
            out = Path(tmp) / name
            argv = cases.command(case, "v4", world, out, list(extra))
            done = subprocess.run([sys.executable, str(HERE / "run_example.py"), "transformers", *argv], env=env,
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{name} failed:\n{(done.stdout + done.stderr)[-4000:]}")
            golden = {
                "made_by": "tests/compat/examples/record_v4_goldens.py",
                "versions": _versions(),
                "argv": [a.replace(str(cases.SCRIPTS), "{scripts}").replace(str(world), "{world}").replace(str(out), "{out}")
                         for a in argv],
                "start_fingerprint": fingerprints[case],
                "result": cases.collect(out, cases.MODEL_CLASSES[case]),
            }
            (cases.GOLDENS / f"{name}.json").write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
            print(f"{name}: written", flush=True)


if __name__ == "__main__":
    main()
