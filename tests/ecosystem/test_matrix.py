"""The library matrix: every ``transformers.Trainer`` subclass that the installed TRL, sentence-transformers and
setfit ship (found at test time, tests/ecosystem/matrix.py) runs a tiny offline model through the route a user
takes (jobs/matrix_job.py), once on upstream and once on trainwell (``patch_transformers()``), same seed, and each
phase is held to upstream's:

- ``train``: every number logged at every training step and the closing summary; the final weights;
- ``evaluate``: ``evaluate()``'s metrics (``compute_metrics``' included where the trainer takes one) and its log
  entry;
- ``predict``: ``predict()``'s metrics and its predictions and labels (row count, sum, sum of squares);
- ``load``: the folder ``save_model`` wrote, loaded by the library's own loader: its outputs on fixed input;
- ``resume``: a fresh trainer resumed from the checkpoint of step 3 equals the uninterrupted run of 6 steps on
  trainwell (the ground truth: every number logged after step 3, the summary's ``train_loss`` and the weights).

A phase upstream itself does not support (it raises there) must raise the same error here. One process per side
runs every case, one after the other (the imports paid once; the runs are shared by the phase tests); the numbers
of each case (largest relative difference, the resume's, its own wall and CPU time) go to ``matrix.json`` under
pytest's base temporary folder and are printed (``-s``): docs/ecosystem.md's matrix table is made from them.

``trl.experimental``'s trainers that run (matrix.py's EXPERIMENTAL_CASES) are held to the same checks
(``test_experimental``), in one process per side of their own (jobs/experimental_job.py).
"""

from __future__ import annotations

import json
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from matrix import (CASES, EXPERIMENTAL_CASES, EXPERIMENTAL_LEFT_OUT, LEFT_OUT, evaluation_entries,
                    experimental_trainers, largest, resumed_entries, shipped_trainers, summary, training_entries,
                    weights_difference)
from parity import run_both

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (find_spec("trl") and find_spec("sentence_transformers")
                                                        and find_spec("setfit")),
                                                   reason="needs the ecosystem extra (trl, sentence-transformers, "
                                                          "setfit)")]

PHASES = ("train", "evaluate", "predict", "load", "resume")
STOP = 3
TOLERANCE = 1e-5
#: (case, phase) -> a known fault that fails it today: strict xfails, so that the fix flips them (none open)
KNOWN: dict[tuple[str, str], str] = {}


def test_every_shipped_trainer_is_in_the_matrix():
    """Each Trainer subclass of the installed libraries has a case or a reason: a new one fails here."""
    shipped = {name for name in shipped_trainers() if not name.startswith("trl.experimental.")}  # below
    assert shipped - set(CASES) - set(LEFT_OUT) == set(), "give these classes a case in CASES or a reason in LEFT_OUT"
    assert set(CASES) | set(LEFT_OUT) <= shipped, "CASES/LEFT_OUT name classes the libraries no longer ship"
    experimental = experimental_trainers()
    assert experimental, "trl.experimental's trainers were not found"
    assert experimental - set(EXPERIMENTAL_CASES) - set(EXPERIMENTAL_LEFT_OUT) == set(), \
        "give these trl.experimental classes a case in EXPERIMENTAL_CASES or a reason in EXPERIMENTAL_LEFT_OUT"
    assert set(EXPERIMENTAL_CASES) | set(EXPERIMENTAL_LEFT_OUT) <= experimental, \
        "EXPERIMENTAL_CASES/EXPERIMENTAL_LEFT_OUT name classes trl.experimental no longer ships"
    assert not set(EXPERIMENTAL_CASES) & set(EXPERIMENTAL_LEFT_OUT), "a class both run and left out"


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny models every case starts from: WORLD/llama and WORLD/bert (built once per session)."""
    from world import build_tiny_bert, build_tiny_llama

    folder = tmp_path_factory.mktemp("matrix_world")
    build_tiny_llama(folder / "llama")
    build_tiny_bert(folder / "bert")
    return folder


@pytest.fixture(scope="session")
def matrix_runs(world: Path, tmp_path_factory: pytest.TempPathFactory):
    """Every case of CASES (jobs/matrix_job.py: all of them one after the other in one process per side, both
    sides at once), run the first time a test asks for one; returns ``get(case) -> runs``."""
    done: dict[str, dict] = {}

    def get(case: str) -> dict:
        if not done:
            done.update(run_all_in_one("matrix_job.py", [",".join(CASES.values()), str(world)], "stable",
                                       tmp_path_factory, timeout=1500))
        return done[case]

    return get


@pytest.fixture(scope="session")
def experimental_runs(world: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every case of trl.experimental (jobs/experimental_job.py), run once; ``{case: runs}``."""
    return run_all_in_one("experimental_job.py", [str(world)], "experimental", tmp_path_factory, timeout=900)


def run_all_in_one(job: str, args: list[str], name: str, tmp_path_factory: pytest.TempPathFactory, *,
                   timeout: float) -> dict[str, dict]:
    """Run ``job args... OUT`` on both sides at once (each side one process running every case, its imports paid
    once); returns ``{case: runs}`` (each side's OUT/CASE/result.json, the folders, the case's own wall time: its
    phases on the slower side). The numbers go to ``matrix.json`` and are printed."""
    out = tmp_path_factory.mktemp(name)
    start = time.perf_counter()
    both = run_both(job, args, out, route="patch", timeout=timeout, reads="process.json")
    report = tmp_path_factory.getbasetemp() / "matrix.json"
    numbers = json.loads(report.read_text()) if report.is_file() else {}
    numbers[name] = {"wall_s": round(time.perf_counter() - start, 1),
                     "cpu_s": {side: both[side]["cpu_s"] for side in ("upstream", "trainwell")}}
    print(f"\nmatrix {name} (all cases): {json.dumps(numbers[name])}")
    done = {}
    for case in both["upstream"]["cases"]:
        folders = {side: both["folder"][side] / case for side in ("upstream", "trainwell")}
        runs = {side: json.loads((folders[side] / "result.json").read_text()) for side in folders}
        runs["folder"] = folders
        runs["wall_s"] = round(max(sum(runs[side]["seconds"].values()) for side in folders), 1)
        done[case] = runs
        numbers[case] = measure(runs)
        print(f"matrix {case}: {json.dumps(numbers[case])}")
    report.write_text(json.dumps(numbers, indent=1))
    return done


def measure(runs: dict) -> dict:
    """The numbers of the README's table, without asserting: per phase, the largest relative difference to
    upstream (inf where the phase failed or the shapes differ); the resume's against the uninterrupted run on
    each side; the wall time of the case and each process's CPU time."""
    up, ours, folders = runs["upstream"], runs["trainwell"], runs["folder"]
    parts = {"train": lambda: max(largest(training_entries(up["history"]), training_entries(ours["history"])),
                                  largest(summary(up["history"]), summary(ours["history"])),
                                  weights_difference(folders["upstream"] / "weights.safetensors",
                                                     folders["trainwell"] / "weights.safetensors")),
             "evaluate": lambda: largest(up["evaluate"], ours["evaluate"]),
             "predict": lambda: largest(up["predict"], ours["predict"]),
             "load": lambda: largest(up["loaded"], ours["loaded"])}
    numbers: dict = {"phases": {}, "wall_s": runs["wall_s"], "errors": ours["errors"],
                     "cpu_s": {side: runs[side].get("cpu_s") for side in ("upstream", "trainwell")}}
    for phase, difference in parts.items():
        try:
            numbers["phases"][phase] = difference()
        except (AssertionError, KeyError, FileNotFoundError):
            numbers["phases"][phase] = float("inf")
    for side in ("upstream", "trainwell"):
        try:
            numbers[f"resume_{side}"] = max(
                largest(resumed_entries(runs[side]["history"], STOP),
                        resumed_entries(runs[side]["resumed_history"], STOP)),
                largest(summary(runs[side]["history"]), summary(runs[side]["resumed_history"])),
                weights_difference(folders[side] / "weights.safetensors", folders[side] / "resumed.safetensors"))
        except (AssertionError, KeyError, FileNotFoundError):
            numbers[f"resume_{side}"] = None if "resume" in up.get("unsupported", {}) else float("inf")
    return numbers


def cases(classes: dict = CASES) -> list:
    params = []
    for case in classes.values():
        for phase in PHASES:
            marks = [pytest.mark.xfail(strict=True, reason=KNOWN[case, phase])] if (case, phase) in KNOWN else []
            params.append(pytest.param(case, phase, marks=marks, id=f"{case}-{phase}"))
    return params


@pytest.mark.parametrize("case, phase", cases())
def test_matrix(matrix_runs, case: str, phase: str):
    check_phase(matrix_runs(case), phase)


@pytest.mark.parametrize("case, phase", cases(EXPERIMENTAL_CASES))
def test_experimental(experimental_runs, case: str, phase: str):
    """trl.experimental's trainers that run, held to the same checks (one process per side for all of them)."""
    assert case in experimental_runs, f"{case} did not run (jobs/experimental_job.py CASES)"
    # a class that cannot train here is left out with its reason, not a case whose errors match
    assert "train" not in experimental_runs[case]["upstream"]["errors"], experimental_runs[case]["upstream"]["errors"]
    check_phase(experimental_runs[case], phase)


def check_phase(runs: dict, phase: str) -> None:
    """One phase of one case against upstream (or, where upstream raises, the same error)."""
    up, ours, folders = runs["upstream"], runs["trainwell"], runs["folder"]
    if phase in up.get("unsupported", {}):
        pytest.skip(up["unsupported"][phase])
    if phase in up["errors"]:  # upstream does not support it: the same error here
        assert ours["errors"].get(phase, "").split(":")[0] == up["errors"][phase].split(":")[0], up["errors"][phase]
        return
    assert phase not in ours["errors"], ours["errors"][phase]
    CHECKS[phase](up, ours, folders)


def check_train(up: dict, ours: dict, folders: dict) -> None:
    assert largest(training_entries(up["history"]), training_entries(ours["history"])) <= TOLERANCE
    assert largest(summary(up["history"]), summary(ours["history"])) <= TOLERANCE
    assert weights_difference(folders["upstream"] / "weights.safetensors",
                              folders["trainwell"] / "weights.safetensors") <= TOLERANCE


def check_evaluate(up: dict, ours: dict, folders: dict) -> None:
    assert largest(up["evaluate"], ours["evaluate"]) <= TOLERANCE
    assert largest(evaluation_entries(up.get("history", [])), evaluation_entries(ours.get("history", []))) <= TOLERANCE


def check_predict(up: dict, ours: dict, folders: dict) -> None:
    assert largest(up["predict"], ours["predict"]) <= TOLERANCE


def check_load(up: dict, ours: dict, folders: dict) -> None:
    assert ours["loaded"], "the loaded model gave no output"
    assert largest(up["loaded"], ours["loaded"]) <= TOLERANCE


def check_resume(up: dict, ours: dict, folders: dict) -> None:
    """Against the ground truth, the uninterrupted run on trainwell (upstream's resumed summary may differ)."""
    full, resumed = ours["history"], ours["resumed_history"]
    assert len(resumed_entries(resumed, STOP)) == len(resumed_entries(full, STOP)) > 0
    assert largest(resumed_entries(full, STOP), resumed_entries(resumed, STOP)) <= 1e-6
    assert largest(summary(full), summary(resumed)) <= 1e-6  # train_loss included
    assert weights_difference(folders["trainwell"] / "weights.safetensors",
                              folders["trainwell"] / "resumed.safetensors") <= 1e-6


CHECKS = {"train": check_train, "evaluate": check_evaluate, "predict": check_predict, "load": check_load,
          "resume": check_resume}
