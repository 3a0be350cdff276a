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
from examples_runs import commands, left, run_side_by_side, same_weights, without

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

GOLDEN_RUNS = {path.stem: json.loads(path.read_text()) for path in sorted(cases.GOLDENS.glob("*.json"))}
_RNG_PENDING = ("DataCollatorForLanguageModeling masks: trainwell's collator draws other masks than transformers' "
                "from the same random state (issue 16 item 3, branch rng)")


def test_every_case_has_a_golden():
    """Every script case (and the accumulation case) has its v4 golden, made by transformers 4.47 from the same
    starting weights the tests build."""
    import examples_world

    assert set(GOLDEN_RUNS) == {*cases.CASES, "glue_accumulation"}
    for name, golden in GOLDEN_RUNS.items():
        assert golden["versions"]["transformers"].startswith("4.47."), name
        assert golden["made_by"] == "tests/compat/examples/record_v4_goldens.py"
    assert examples_world.__name__  # the fingerprints are checked against the built world in ``trainwell_runs``


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
        jobs = {name: commands("trainwell", [a.format(world=world, out=outs[name])
                                             for a in GOLDEN_RUNS[name]["argv"]]) for name in batch}
        results.update(run_side_by_side(jobs, outs))
    return results


def _compare(name: str, golden: dict, ours: dict) -> None:
    up, tw = without(golden, "learning_rate", "loss"), without(ours, "learning_rate", "loss")
    diffs = same_weights(up.pop("weights"), tw.pop("weights")) + cases.close(up, tw)
    for i, (g, o) in enumerate(zip(golden["log_history"], ours["log_history"])):
        if "loss" in g:
            diffs += cases.close(g["loss"], o.get("loss"), rel=0, abs_=5e-5, path=f"/log_history[{i}]/loss")
    assert not diffs, f"{name}: trainwell differs from transformers 4.47 at:\n" + "\n".join(diffs[:30])


@pytest.mark.parametrize("name", [
    "clm", "glue", "ner", "qa", "summarization", "swag",
    pytest.param("mlm", marks=pytest.mark.xfail(strict=True, reason=_RNG_PENDING)),
])
def test_same_run_as_v4(name, trainwell_runs):
    """trainwell's run of the v4 command line equals 4.47's golden."""
    _compare(name, GOLDEN_RUNS[name]["result"], left(trainwell_runs[name], name.split("_")[0]))


def test_accumulation_logs_the_big_batch_loss(trainwell_runs):
    """run_glue with 2 micro-batches of 2 per step: the update equals 4.47's (same weights, eval metrics), but 4.47
    logs the SUM of the micro-batch means (twice the batch's loss: 1.4053 at step 2 for 0.7026, a train_loss of
    1.399); trainwell logs the mean, the loss of the 4 examples as one batch."""
    golden = GOLDEN_RUNS["glue_accumulation"]["result"]
    ours = left(trainwell_runs["glue_accumulation"], "glue")
    for g, o in zip(golden["log_history"], ours["log_history"]):
        if "loss" in g:
            assert o["loss"] == pytest.approx(g["loss"] / 2, abs=5e-5), (g, o)
        if "train_loss" in g:  # 4.47: 1.399 over the run, the sum again
            assert o["train_loss"] == pytest.approx(g["train_loss"] / 2, rel=1e-5), (g, o)
    for name in ("all_results.json", "train_results.json"):
        assert ours[name]["train_loss"] == pytest.approx(golden[name]["train_loss"] / 2, rel=1e-5)
    up, tw = (without(rec, "learning_rate", "loss", "train_loss") for rec in (golden, ours))
    diffs = same_weights(up.pop("weights"), tw.pop("weights")) + cases.close(up, tw)
    assert not diffs, "\n".join(diffs[:30])
