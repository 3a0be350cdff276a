"""The example scripts with the v4 API the seeds document (``--evaluation_strategy``, ``--overwrite_output_dir``,
``--warmup_ratio``), run with trainwell and compared with goldens recorded once from transformers 4.47
(``record_v4_goldens.py``, rerunnable in a separate venv; each golden names the versions that made it).

Compared: exit status, the files and checkpoints written, the log history step by step, the metrics files, the
prediction files and the saved model's weights (per-tensor sums). 4.47 rounds the logged loss to 4 decimals, so
``loss`` is compared to 5e-5. The logged learning rate is left out: 4.47 logs the rate after the scheduler's step,
5.x the rate the step used, and trainwell follows the installed upstream.
Where 4.47 is wrong (the logged loss under gradient accumulation is the sum of the micro-batch means; Seq2SeqTrainer's
eval_loss weighs a short last batch as a full one), the test asserts the ground truth and names 4.47's figure.
The world's tokenizer returns token_type_ids as 4.47's did (5.x's returns none unless told): with them, qa, swag
and clm agree with 4.47 from the first step.
"""

from __future__ import annotations

import json

import pytest

import examples_cases as cases
from examples_runs import (commands, left, run_side_by_side, same_weights, upstream_eval_one_per_batch,  # noqa: F401
                           without, world)

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

GOLDEN_RUNS = {path.stem: json.loads(path.read_text()) for path in sorted(cases.GOLDENS.glob("*.json"))}


def test_every_case_has_a_golden():
    """Every script case (and the accumulation case) has its v4 golden, made by transformers 4.47 from the same
    starting weights the tests build (checked in ``trainwell_runs``)."""
    assert set(GOLDEN_RUNS) == {*cases.CASES, "glue_accumulation"}
    for name, golden in GOLDEN_RUNS.items():
        assert golden["versions"]["transformers"].startswith("4.47."), name
        assert golden["made_by"] == "tests/compat/examples/record_v4_goldens.py"
        assert not [a for a in golden["argv"] if a.startswith("/")], f"{name}: an absolute path (use the placeholders)"

# Written by the tokenizer's own save_pretrained in 4.x (the installed 5.x tokenizer no longer writes it).
_TOKENIZER_4X_FILES = ("special_tokens_map.json",)
# Written by the model's own save_pretrained in 4.47, where every model could generate (BertForMaskedLM included);
# the installed 5.x writes it only for models that generate.
_MODEL_4X_FILES = {"mlm": ("generation_config.json",)}


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
    dropped = _TOKENIZER_4X_FILES + _MODEL_4X_FILES.get(name, ())
    up["files"] = [f for f in up["files"] if f not in dropped]
    diffs = same_weights(up.pop("weights"), tw.pop("weights"), name.split("_")[0]) + cases.close(up, tw)
    for i, (g, o) in enumerate(zip(golden["log_history"], ours["log_history"])):
        if "loss" in g:
            diffs += cases.close(g["loss"], o.get("loss"), rel=0, abs_=5e-5, path=f"/log_history[{i}]/loss")
    assert not diffs, f"{name}: trainwell differs from transformers 4.47 at:\n" + "\n".join(diffs[:30])


@pytest.mark.parametrize("name", ["glue", "ner", "clm", "qa", "swag", "mlm"])
def test_same_run_as_v4(name, trainwell_runs):
    """trainwell's run of the v4 command line equals 4.47's golden."""
    _compare(name, GOLDEN_RUNS[name]["result"], left(trainwell_runs[name], name.split("_")[0]))


_SEQ2SEQ_EVAL_KEYS = ("eval_loss", "predict_loss")


def test_summarization_same_run_as_v4_but_eval_loss(trainwell_runs):
    """run_summarization: training, ROUGE, generated lengths (20.0 at every evaluation during training: 20 new
    tokens on every batch, as trainwell), predictions and weights equal 4.47's; its eval/predict loss is checked in
    the next test."""
    golden = without(GOLDEN_RUNS["summarization"]["result"], *_SEQ2SEQ_EVAL_KEYS)
    _compare("summarization", golden, without(left(trainwell_runs["summarization"], "summarization"),
                                              *_SEQ2SEQ_EVAL_KEYS))


def test_summarization_eval_loss_is_the_ground_truth(trainwell_runs, world, tmp_path):
    """4.47's Seq2SeqTrainer, as 5.x's, counts the short last evaluation batch (1 of 13 samples, batches of 4) as
    a full one: its final eval_loss is 5.6127 (5.6708 at step 6) where trainwell's is 5.6211 (5.6779), the mean over
    the samples of trainwell's final model as transformers' own script measures it evaluating one sample per batch."""
    ours = left(trainwell_runs["summarization"], "summarization")
    truth = upstream_eval_one_per_batch("summarization", world, trainwell_runs["summarization"]["out"],
                                        tmp_path / "eval")["eval_results.json"]["eval_loss"]
    assert ours["eval_results.json"]["eval_loss"] == pytest.approx(truth, rel=1e-5)
    golden = GOLDEN_RUNS["summarization"]["result"]["eval_results.json"]["eval_loss"]
    assert golden != pytest.approx(truth, rel=1e-4)


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
