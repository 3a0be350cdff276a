"""Running the example scripts in child processes (one library per process, the two libraries side by side) and
reading back what each run left."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import pytest

import examples_cases as cases
from helpers import launch

RUNNER = Path(__file__).resolve().parent / "run_example.py"
TIMEOUT = 600


def commands(library: str, argv: Sequence[str], *, ranks: int = 1) -> list[str]:
    """The command running a script (``argv``: its path then its arguments) under ``library`` on ``ranks``
    processes (torchrun with gloo on the CPU for 2): ``transformers`` (as written), ``trainwell`` (the import
    changed), ``patch`` (``patch_transformers()`` first) or ``run`` (``trainwell run``, one process)."""
    if library == "run":  # the script as written, launched by the trainwell command
        return [sys.executable, "-m", "trainwell", "run", str(RUNNER), "transformers", *argv]
    if ranks == 1:
        return [sys.executable, str(RUNNER), library, *argv]
    return launch.torchrun(RUNNER, library, *argv, nproc=ranks)


def run_side_by_side(jobs: dict[str, list[str]], outs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    """Start every job at once (each writes into its ``outs`` folder, emptied first), wait for all, and return per
    job its exit status, output tail and what it left (:func:`examples_cases.collect`)."""
    procs = {}
    for name, cmd in jobs.items():
        shutil.rmtree(outs[name], ignore_errors=True)
        procs[name] = launch.start(cmd)
    results = {}
    for name, proc in procs.items():
        done = launch.wait(proc, name, timeout=TIMEOUT, check=False)
        results[name] = {"rc": done.returncode, "tail": (done.stdout or "")[-3000:], "out": outs[name]}
    return results


def upstream_eval_one_per_batch(case: str, world: Path, model: Path, out: Path) -> dict[str, Any]:
    """What ``case``'s script run by the installed transformers leaves when it only evaluates ``model`` (a finished
    run's output folder), one sample per batch: no short last batch, so its eval_loss is the plain mean over the
    samples whatever the library does with a partial batch."""
    argv = [a for a in cases.command(case, "5x", world, out) if a not in ("--do_train", "--do_predict")]
    argv[argv.index("--model_name_or_path") + 1] = str(model)
    done = run_side_by_side({case: commands("transformers", [*argv, "--per_device_eval_batch_size", "1"])},
                            {case: out})[case]
    if done["rc"] != 0:
        pytest.fail(f"the {case} evaluation at batch size 1 exited with {done['rc']}:\n{done['tail']}")
    return cases.collect(out)


def left(result: dict[str, Any], case: str) -> dict[str, Any]:
    """What a successful run left, weights included (fails the test with the job's output otherwise)."""
    import pytest

    if result["rc"] != 0:
        pytest.fail(f"the {case} run exited with {result['rc']}:\n{result['tail']}")
    return cases.collect(result["out"], cases.MODEL_CLASSES[case])


def without(record: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``record`` with ``keys`` dropped from every log entry and metrics file (compared apart)."""
    out = dict(record)
    out["log_history"] = [{k: v for k, v in e.items() if k not in keys} for e in record["log_history"]]
    for name in ("all_results.json", "train_results.json", "eval_results.json", "predict_results.json"):
        if name in out:
            out[name] = {k: v for k, v in out[name].items() if k not in keys}
    return out


# Parameters the loss does not depend on (a softmax is unchanged by adding a constant to all its inputs): their
# gradient is round-off, which Adam scales up to learning-rate-sized steps, so two correct runs end them apart.
GRADIENT_FREE = {
    "*": re.compile(r"attention\.self\.key\.bias$"),  # softmax over the keys
    "qa": re.compile(r"^qa_outputs\.bias$|^bert\.encoder\.layer\.1\.output\.LayerNorm\.bias$"),  # over positions
    "swag": re.compile(r"^classifier\.bias$"),  # softmax over the choices
}
GRADIENT_FREE_BOUND = 0.05  # 18 Adam steps of at most lr=1e-3 each, per element, summed over a 16-element bias


def same_weights(a: dict[str, list[float]], b: dict[str, list[float]], case: str) -> list[str]:
    """Per-tensor sums and sums of squares equal to float noise (relative 1e-4, absolute 2e-4); the case's
    :data:`GRADIENT_FREE` parameters only within :data:`GRADIENT_FREE_BOUND` of each other."""
    free = [GRADIENT_FREE["*"], *([GRADIENT_FREE[case]] if case in GRADIENT_FREE else [])]
    loose = {name for name in a if any(p.search(name) for p in free)}
    diffs = cases.close({k: v for k, v in a.items() if k not in loose}, {k: v for k, v in b.items() if k not in loose},
                        rel=1e-4, abs_=2e-4, path="/weights")
    return diffs + cases.close({k: a[k] for k in loose}, {k: b.get(k) for k in loose}, rel=0,
                               abs_=GRADIENT_FREE_BOUND, path="/weights(gradient-free)")


_WORLD: list[Path] = []


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder :mod:`examples_world` builds (a tokenizer, one tiny model per task with dropout 0, the data), built
    once per session however many test modules import this fixture. It lives here, not in a ``conftest.py``: a
    second ``conftest`` module would shadow ``tests/conftest.py`` for the tests that import from it."""
    pytest.importorskip("transformers")
    if not _WORLD:
        import examples_world

        folder = tmp_path_factory.mktemp("examples_world")
        examples_world.build(folder)
        _WORLD.append(folder)
    return _WORLD[0]
