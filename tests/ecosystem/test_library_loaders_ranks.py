"""Loaders a library builds itself, on two CPU ranks (gloo), as upstream splits them: sentence-transformers passes
its own loaders (its own batch sampler) to ``accelerator.prepare``; TRL's ``GRPOTrainer`` returns its own
``RepeatSampler`` from ``_get_train_sampler`` / ``_get_eval_sampler``. Both are split across the ranks as
accelerate's ``BatchSamplerShard`` splits them for upstream: the same batches on each rank, the same epochs, every
logged number equal to upstream's on 2 ranks (before, both ranks trained on the same batches: ``epoch`` 1.5 for
3.0, eval_loss 0.871659 for 0.784534, GRPO's loss 1.6e4 times off).

And an uneven evaluation set on trainwell's own sampler (``DPOTrainer``, 7 and 6 pairs in global batches of 4):
each pair is evaluated once, so TRL's metrics, gathered inside ``compute_loss``, are those of one process
evaluating the same global batches (upstream's accelerate repeats pairs to even out the ranks and TRL counts them:
README, differences table). A rank with no pair left evaluates a placeholder batch, which gives nothing to what TRL
gathers (before: ``eval_rewards/rejected`` -0.00729 for -0.00165 with 6 pairs).

One launch per side runs every case (tests/ecosystem/jobs/ranks_job.py): upstream on 2 ranks, trainwell (the patch)
on 2 ranks, upstream in one process (global batches of 4 there too) for the DPO cases.
"""

from __future__ import annotations

import json
import sys

import pytest

pytest.importorskip("trl")
pytest.importorskip("sentence_transformers")

from helpers import launch
from parity import JOBS, largest_difference
from world import build_tiny_bert, build_tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
JOB = JOBS / "ranks_job.py"
DPO_CASES = ("dpo_eval7", "dpo_eval6")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("ranks")
    world = root / "world"
    build_tiny_bert(world / "bert")
    build_tiny_llama(world / "llama")
    folders = {side: root / side for side in ("upstream", "trainwell", "one_process")}
    dpo = ",".join(DPO_CASES)
    commands = {
        "upstream": launch.torchrun(JOB, "st,grpo", world, folders["upstream"]),
        "trainwell": launch.torchrun(JOB, f"st,grpo,{dpo}", world, folders["trainwell"], "--patch"),
        "one_process": [sys.executable, str(JOB), dpo, str(world), str(folders["one_process"])],
    }
    procs = {side: launch.start(cmd) for side, cmd in commands.items()}
    done = {side: launch.wait(proc, f"ranks_job ({side})", timeout=420) for side, proc in procs.items()}
    assert "trainwell Trainer under sentence_transformers.SentenceTransformerTrainer" in done["trainwell"].stdout
    return folders


def _ranks(folder, case: str) -> list[dict]:
    return [json.loads((folder / f"{case}.rank{rank}.json").read_text()) for rank in (0, 1)]


def _history(folder, case: str) -> list[dict]:
    return json.loads((folder / f"{case}.json").read_text())


@pytest.mark.parametrize("case, epochs", [("st", 3.0), ("grpo", 2.0)])
def test_a_library_built_loader_is_split_across_ranks_as_upstream(runs, case, epochs):
    for side in ("upstream", "trainwell"):
        assert _ranks(runs[side], case) == [{"global_step": 6, "epoch": epochs, "steps": 6}] * 2, side
    upstream, ours = _history(runs["upstream"], case), _history(runs["trainwell"], case)
    assert sum("eval_loss" in entry for entry in ours) == 2
    assert largest_difference(upstream, ours) <= 1e-6  # measured: 0.0 for both (timings aside)


@pytest.mark.parametrize("case", DPO_CASES)
def test_uneven_eval_set_trl_metrics_count_each_sample_once(runs, case):
    (one,) = [entry for entry in _history(runs["one_process"], case) if "eval_loss" in entry]
    (ours,) = [entry for entry in _history(runs["trainwell"], case) if "eval_loss" in entry]
    keys = [key for key in one if key.startswith("eval_") and not key.endswith(("_runtime", "_per_second"))]
    assert len(keys) > 10 and sorted(ours) == sorted(one)
    for key in keys:  # measured: at most 1.6e-5 relative (eval_rewards/margins, 0.0029)
        assert ours[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), key
