"""Distributed evaluation returns what one process returns: losses, metrics, predictions, labels.

One torchrun launch (2 ranks, gloo, CPU) runs every scenario of ``eval_parity_job.py`` in sequence; a plain process
runs the same scenarios at the same time (and the main ones through ``transformers.Trainer`` too, the oracle for
one process). Datasets of odd lengths (1, 7, 37: the last global batch is short, and some ranks have no sample
left in it) with ragged sequences, per-device eval batch sizes 1 and 8, under every option that changes how
outputs are gathered: ``eval_do_concat_batches=False``, ``batch_eval_metrics``, ``eval_accumulation_steps``,
``include_for_metrics``, ``dataloader_drop_last``, and an ``IterableDataset`` (read whole by every rank).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.launch import start, torchrun, wait

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
JOB = HERE / "eval_parity_job.py"
TIMEOUT_S = 420
TIMING_KEYS = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


def _job_module() -> Any:
    spec = importlib.util.spec_from_file_location("eval_parity_job", JOB)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_JOB = _job_module()
SCENARIOS = [f"{option}/n={n}/bs={batch}" for option, n, batch in _JOB.scenarios()]
UPSTREAM = [key for key in SCENARIOS if key.split("/")[0] in _JOB.UPSTREAM_OPTIONS]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the 2-rank launch and the 1-process reference (concurrently); return both results."""
    tmp = tmp_path_factory.mktemp("eval_parity")
    dist_proc = start(torchrun(JOB, tmp / "dist.json", tmp / "dist_out"))
    ref_proc = start([sys.executable, JOB, tmp / "ref.json", tmp / "ref_out", "--upstream"])
    wait(ref_proc, "the 1-process reference run", timeout=TIMEOUT_S)
    wait(dist_proc, "the 2-rank torchrun launch", timeout=TIMEOUT_S)
    return {"dist": json.loads((tmp / "dist.json").read_text()), "ref": json.loads((tmp / "ref.json").read_text())}


def _metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not k.endswith(TIMING_KEYS) and k != "epoch"}


def _assert_same(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    for name in ("evaluate", "loss_only", "predict_metrics"):
        got_m, want_m = _metrics(got[name]), _metrics(want[name])
        assert sorted(got_m) == sorted(want_m), f"{what}: {name} keys"
        for key, value in want_m.items():
            assert got_m[key] == pytest.approx(value, rel=1e-6, abs=1e-6), f"{what}: {name}[{key}]"
    for k, (got_p, want_p) in enumerate(zip(got["predictions"], want["predictions"])):
        np.testing.assert_allclose(np.asarray(got_p), np.asarray(want_p), rtol=0, atol=1e-6,
                                   err_msg=f"{what}: predictions[{k}]")
    assert len(got["predictions"]) == len(want["predictions"])
    np.testing.assert_array_equal(np.asarray(got["label_ids"]), np.asarray(want["label_ids"]), err_msg=what)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_ranks_evaluate_and_predict_like_one_process(runs: dict[str, Any], scenario: str) -> None:
    got, want = runs["dist"][scenario], runs["ref"][scenario]
    _assert_same(got, want, scenario)
    option, n = scenario.split("/")[:2]
    rows = int(n.split("=")[1])
    if option == "drop_last":
        batch = int(scenario.split("bs=")[1])
        rows = rows // batch * batch
    assert len(np.asarray(want["label_ids"])) == rows  # every sample once, no padding duplicate
    assert got["loss_only"]["eval_loss"] == pytest.approx(got["evaluate"]["eval_loss"], rel=1e-6)
    if option == "no_concat":  # the same list of batches as one process (each rank's batch kept apart)
        assert got["batch_rows"] == want["batch_rows"]
    if option == "include":  # the losses handed to compute_metrics: one per sample
        assert got["evaluate"]["eval_loss_rows"] == rows


@pytest.mark.parametrize("scenario", UPSTREAM)
def test_one_process_matches_transformers_trainer(runs: dict[str, Any], scenario: str) -> None:
    _assert_same(runs["ref"][scenario], runs["ref"][f"upstream/{scenario}"], f"upstream {scenario}")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 7])
def test_round_robin_deals_every_batch_once_and_ranks_stay_in_step(n: int, world: int) -> None:
    """An iterable dataset's batches: every rank runs the same number of steps; real batches, gathered step by
    step in rank order, are the stream itself."""
    from trainwell.loops.gather import _round_robin

    dealt = [list(_round_robin(range(n), rank, world)) for rank in range(world)]
    assert len({len(d) for d in dealt}) == 1
    gathered = [batch for step in zip(*dealt) for batch, placeholder in step if placeholder is None]
    assert gathered == list(range(n))
    assert all(batch in range(n) for d in dealt for batch, _ in d)  # a placeholder is a real batch, run and dropped
