"""TRL's preference trainers evaluate on trainwell as on ``transformers.Trainer``: their collators put a batch's
chosen and rejected sequences into one batch of twice the pairs, and every batch's loss and metrics count.

4 training steps, then 8 pairs in 2 batches of 4 (8 rows each), the tiny offline Llama of tests/ecosystem/world.py, each side in a
process of its own (tests/ecosystem/parity.py); trainwell through ``python -m trainwell run``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("transformers")

from parity import run_both
from world import build_tiny_llama

pytestmark = pytest.mark.slow

TIMING = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny_llama")))


def eval_entry(history: list[dict]) -> dict[str, float]:
    """The one evaluation's logged metrics (``eval_*``), timings aside."""
    entries = [entry for entry in history if "eval_loss" in entry]
    assert len(entries) == 1, history
    return {key: value for key, value in entries[0].items() if key.startswith("eval_") and not key.endswith(TIMING)}


@pytest.mark.parametrize("case", ["reward", "dpo"])
def test_preference_evaluate_counts_every_batch_as_upstream(model_dir, tmp_path, case):
    runs = run_both("trl_eval_job.py", [case, model_dir], tmp_path, route="run")
    upstream, ours = eval_entry(runs["upstream"]), eval_entry(runs["trainwell"])
    assert sorted(ours) == sorted(upstream)
    for key, value in upstream.items():
        assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
