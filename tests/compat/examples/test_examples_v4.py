"""The example scripts with the v4 API the seeds document (``--evaluation_strategy``, ``--overwrite_output_dir``,
``--warmup_ratio``), run with trainwell and compared with goldens recorded once from transformers 4.47
(``record_v4_goldens.py``, rerunnable in a separate venv; each golden names the versions that made it).

Compared: exit status, the files and checkpoints written, the log history step by step, the metrics files, the
prediction files and the saved model's weights (per-tensor sums). 4.47 rounds the logged loss to 4 decimals, so
``loss`` is compared to 5e-5. The logged learning rate is left out: 4.47 logs the rate after the scheduler's step,
5.x the rate the step used, and trainwell follows the installed upstream (issue 16 item 2).
Where 4.47 is wrong (the logged loss under gradient accumulation is the sum of the micro-batch means), the test
asserts the ground truth and names 4.47's figure.
"""

from __future__ import annotations

import json

import pytest

import examples_cases as cases
from examples_runs import commands, left, run_side_by_side, same_weights, without, world  # noqa: F401 (fixture)

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

GOLDEN_RUNS = {path.stem: json.loads(path.read_text()) for path in sorted(cases.GOLDENS.glob("*.json"))}
_RNG_PENDING = ("run_mlm differs from 4.47 from the first logged loss (the masks drawn when a batch is collated, "
                "or the random state then; as against 5.x: issue 16 item 3, to look into)")


def test_every_case_has_a_golden():
    """Every script case (and the accumulation case) has its v4 golden, made by transformers 4.47 from the same
    starting weights the tests build (checked in ``trainwell_runs``)."""
    assert set(GOLDEN_RUNS) == {*cases.CASES, "glue_accumulation"}
    for name, golden in GOLDEN_RUNS.items():
        assert golden["versions"]["transformers"].startswith("4.47."), name
        assert golden["made_by"] == "tests/compat/examples/record_v4_goldens.py"
        assert not [a for a in golden["argv"] if a.startswith("/")], f"{name}: an absolute path (use the placeholders)"

_SEQ2SEQ_EVAL = ("Seq2SeqTrainer evaluation: eval_loss differs from 4.47's (5.6779 vs 5.6708 at step 6 after "
                 "identical training), as from 5.x's (test_examples_5x); not the learning rate or the random streams")
_FIRST_STEP = ("differs from 4.47 from the first logged step (loss and grad norm), while the same case agrees with "
               "transformers 5.24 (test_examples_5x); cause not yet identified (not the dropout: it is 0)")
# Written by the tokenizer's own save_pretrained in 4.x (the installed 5.x tokenizer no longer writes it).
_TOKENIZER_4X_FILES = ("special_tokens_map.json",)


@pytest.fixture(scope="module")
def trainwell_runs(world, tmp_path_factory):
    """``get(name)``: trainwell's run of a golden's command line (run two at a time, all at the first call)."""
    fingerprints = json.loads((world / "fingerprints.json").read_text())
    for name, golden in GOLDEN_RUNS.items():
        case = name.split("_")[0]
        assert golden["start_fingerprint"] == fingerprints[case], f"{name}: another starting model than 4.47's"
    results = {}
    names = list(GOLDEN_RUNS)
    base = tmp_path_factory.mktemp("v4")
    for i in range(0, len(names), 2):
        batch = names[i:i + 2]
        outs = {name: base / name for name in batch}
        jobs = {name: commands("trainwell", [a.format(world=world, out=outs[name], scripts=cases.SCRIPTS)
                                             for a in GOLDEN_RUNS[name]["argv"]]) for name in batch}
        results.update(run_side_by_side(jobs, outs))
    return results


def _compare(name: str, golden: dict, ours: dict) -> None:
    up, tw = without(golden, "learning_rate", "loss"), without(ours, "learning_rate", "loss")
    up["files"] = [f for f in up["files"] if f not in _TOKENIZER_4X_FILES]
    diffs = same_weights(up.pop("weights"), tw.pop("weights"), name.split("_")[0]) + cases.close(up, tw)
    for i, (g, o) in enumerate(zip(golden["log_history"], ours["log_history"])):
        if "loss" in g:
            diffs += cases.close(g["loss"], o.get("loss"), rel=0, abs_=5e-5, path=f"/log_history[{i}]/loss")
    assert not diffs, f"{name}: trainwell differs from transformers 4.47 at:\n" + "\n".join(diffs[:30])


@pytest.mark.parametrize("name", [
    "glue", "ner",
    pytest.param("clm", marks=pytest.mark.xfail(strict=True, reason=f"run_clm (GPT-2) {_FIRST_STEP}")),
    pytest.param("qa", marks=pytest.mark.xfail(strict=True, reason=f"run_qa {_FIRST_STEP}")),
    pytest.param("swag", marks=pytest.mark.xfail(strict=True, reason=f"run_swag {_FIRST_STEP}")),
    pytest.param("summarization", marks=pytest.mark.xfail(strict=True, reason=_SEQ2SEQ_EVAL)),
    pytest.param("mlm", marks=pytest.mark.xfail(strict=True, reason=_RNG_PENDING)),
])
def test_same_run_as_v4(name, trainwell_runs):
    """trainwell's run of the v4 command line equals 4.47's golden."""
    _compare(name, GOLDEN_RUNS[name]["result"], left(trainwell_runs[name], name.split("_")[0]))


def test_accumulation_is_the_big_batch(trainwell_runs):
    """run_glue with 2 micro-batches of 2 per step is, under trainwell, the run with batches of 4 (the ground truth:
    the same windows, so every logged loss, grad norm, metric, prediction and weight equals 4.47's batch-4 golden).
    4.47 itself logs the SUM of the micro-batch means and back-propagates it: its logged loss and grad norm are
    about twice the batch's (1.4053 at step 2 for 0.7026; train_loss 1.399), and clipping the doubled gradient
    moves its run away from the batch-4 one."""
    ours = left(trainwell_runs["glue_accumulation"], "glue")
    _compare("glue, 2 x 2 accumulated vs 4.47's batches of 4", GOLDEN_RUNS["glue"]["result"], ours)
    summed = GOLDEN_RUNS["glue_accumulation"]["result"]
    first = next(e for e in summed["log_history"] if "loss" in e)
    assert first["loss"] == pytest.approx(2 * ours["log_history"][0]["loss"], abs=1e-4)
    assert first["grad_norm"] == pytest.approx(2 * ours["log_history"][0]["grad_norm"], rel=1e-4)
    assert summed["all_results.json"]["train_loss"] == pytest.approx(2 * ours["all_results.json"]["train_loss"],
                                                                     rel=0.01)
