"""``trainer.accelerator`` under torchrun (2 ranks, gloo): trainwell's answers equal upstream's accelerate ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.launch import run_json, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("accelerator")
    return run_json(torchrun(HERE / "accelerator_job.py", out), out / "result.json", "the 2-rank accelerator job",
                    timeout=600)


def test_collectives_on_two_ranks(result):
    ours = result["trainwell"]
    assert (ours["num_processes"], ours["process_index"], ours["is_main"]) == (2, 0, True)
    assert ours["distributed_type"] == "MULTI_CPU"
    assert ours["gather"] == [[0.0, 1.0], [2.0, 3.0], [10.0, 11.0], [12.0, 13.0]]
    assert ours["gather_for_metrics"] == ours["gather"]  # no padding duplicates to drop
    assert ours["gather_objects"] == ["r0a", "r0b", "r1a", "r1b"]
    assert ours["reduce_sum"] == [[10.0, 12.0], [14.0, 16.0]]
    assert ours["reduce_mean"] == [[5.0, 6.0], [7.0, 8.0]]
    assert ours["pad"] == [[1.0, 1.0], [-1.0, -1.0]]
    assert ours["gather_uneven"] == [0.0, 1.0, 1.0]


def test_same_answers_as_upstream_accelerate(result):
    if "transformers" not in result:
        pytest.skip("transformers is not installed")
    ours = {k: v for k, v in result["trainwell"].items() if k != "gather_uneven"}
    assert ours == result["transformers"]
