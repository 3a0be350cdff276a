"""``train_sampling_strategy="group_by_length"`` orders evaluation and prediction too, as the installed
``transformers.Trainer`` (5.24) does in ``_get_eval_sampler``: a length-grouped order in mega-batches of
``eval_batch_size``, drawn from a generator seeded with ``data_seed`` (else ``seed``), the lengths read from the
``length_column_name`` column of a ``datasets.Dataset`` or else from each example's first model input of the
processing class (``input_ids`` without one). trainwell evaluated in the dataset's order: other batches, so another
padding and another ``eval_loss`` on the same weights, and ``predict()`` rows in another order.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from helpers.models import TokenLM

transformers = pytest.importorskip("transformers")

import trainwell  # noqa: E402

transformers.logging.set_verbosity_error()

pytestmark = pytest.mark.slow  # the upstream Trainer: seconds

VOCAB = 11


def _rows(n: int = 22, key: str = "input_ids") -> list[dict[str, list[int]]]:
    """``n`` token sequences of 2 to 12 tokens (labels: the tokens themselves)."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 13, (n,), generator=g).tolist()
    rows = []
    for length in lengths:
        ids = torch.randint(1, VOCAB, (length,), generator=g).tolist()
        rows.append({key: ids, "labels": ids})
    return rows


def _pad(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-pads ``input_ids`` with 0 and ``labels`` with -100 to the batch's longest row."""
    width = max(len(f["input_ids"]) for f in features)
    return {"input_ids": torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features]),
            "labels": torch.tensor([f["labels"] + [-100] * (width - len(f["labels"])) for f in features])}


def _trainer(lib: Any, out: Any, model: torch.nn.Module, **options: Any) -> Any:
    extra = {"processing_class": options.pop("processing_class")} if "processing_class" in options else {}
    args = lib.TrainingArguments(output_dir=str(out), per_device_eval_batch_size=4, report_to="none",
                                 disable_tqdm=True, use_cpu=True, seed=0, remove_unused_columns=False, **options)
    return lib.Trainer(model=copy.deepcopy(model), args=args, data_collator=_pad, **extra)


def test_evaluate_and_predict_are_length_grouped_as_upstream(tmp_path):
    torch.manual_seed(0)
    model, data = TokenLM(vocab=VOCAB), _rows()
    results = {}
    for lib in (trainwell, transformers):
        trainer = _trainer(lib, tmp_path / lib.__name__, model, train_sampling_strategy="group_by_length")
        metrics = trainer.evaluate(eval_dataset=data)
        assert trainer.evaluate(eval_dataset=data)["eval_loss"] == metrics["eval_loss"]  # the same order each time
        results[lib.__name__] = (metrics["eval_loss"], trainer.predict(data), list(trainer._get_eval_sampler(data)))
    (ours, ours_pred, ours_order), (theirs, theirs_pred, theirs_order) = results["trainwell"], results["transformers"]
    assert ours_order == theirs_order and ours_order != list(range(len(data)))
    assert ours == pytest.approx(theirs, rel=1e-6)
    np.testing.assert_allclose(ours_pred.predictions, theirs_pred.predictions, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(ours_pred.label_ids, theirs_pred.label_ids)
    assert ours_pred.metrics["test_loss"] == pytest.approx(theirs_pred.metrics["test_loss"], rel=1e-6)
    # the grouping is what changes the numbers: the dataset's order evaluates other batches
    sequential = _trainer(trainwell, tmp_path / "sequential", model).evaluate(eval_dataset=data)["eval_loss"]
    assert abs(sequential - ours) > 1e-4


def test_eval_order_reads_lengths_and_seed_as_upstream(tmp_path):
    """The column ``length_column_name`` of a ``datasets.Dataset`` (here not the token counts), the processing
    class's first model input name, and ``data_seed`` over ``seed``: the same order as upstream's in each case."""
    datasets = pytest.importorskip("datasets")
    torch.manual_seed(0)
    model, rows = TokenLM(vocab=VOCAB), _rows(40)
    with_column = datasets.Dataset.from_list(
        [{**row, "length": (7 * i) % 13} for i, row in enumerate(rows)])
    cases = [
        (with_column, {}),
        (with_column, {"length_column_name": "other"}),  # no such column: the tokens are counted
        (_rows(40, key="input_values"), {"processing_class": SimpleNamespace(model_input_names=["input_values"])}),
        (rows, {"data_seed": 5}),
    ]
    for i, (data, options) in enumerate(cases):
        orders = []
        for lib in (trainwell, transformers):
            trainer = _trainer(lib, tmp_path / f"{i}-{lib.__name__}", model,
                               train_sampling_strategy="group_by_length", **options)
            orders.append(list(trainer._get_eval_sampler(data)))
        assert orders[0] == orders[1], f"case {i}: {options}"
        assert sorted(orders[0]) == list(range(len(data))) and orders[0] != list(range(len(data)))
