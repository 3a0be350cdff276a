"""Nothing the user asked for is skipped silently: each case warns once or raises, naming why and the fix.

- ``compute_metrics`` given but impossible (no logits / no labels): one warning per reason;
- string labels: an error naming the column and a label encoder (instead of "missing column" later);
- ``save_total_limit=0`` (upstream: silently keeps every checkpoint): an error;
- a dataset yielding more or fewer examples than its ``__len__``: an error (counted while it is iterated).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainwell import DataCollatorWithPadding, Trainer, TrainingArguments, default_data_collator

DIM = 3


class Regressor(nn.Module):
    def __init__(self, logits: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(DIM, 1)
        self.logits = logits

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pred = self.linear(x).squeeze(-1)
        out = {"logits": pred} if self.logits else {}
        if labels is not None:
            out["loss"] = F.mse_loss(pred, labels.float())
        return out


def rows(n: int = 10, labels: bool = True) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, DIM, generator=g)
    return [{"x": x[i], **({"labels": x[i].sum()} if labels else {})} for i in range(n)]


def _args(tmp_path, **kw) -> TrainingArguments:
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no")
    common.update(kw)
    return TrainingArguments(**common)


def _metrics_skipped(record) -> list[str]:
    return [str(w.message) for w in record if "compute_metrics was not called" in str(w.message)]


# -------------------------------------------------------------------------------------------- compute_metrics
def test_compute_metrics_without_logits_warns_once_naming_why(tmp_path):
    called = []
    trainer = Trainer(model=Regressor(logits=False), args=_args(tmp_path), eval_dataset=rows(),
                      compute_metrics=lambda p: called.append(p) or {"x": 1.0})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        first = trainer.evaluate()
        trainer.evaluate()
    assert called == [] and "eval_x" not in first and "eval_loss" in first
    skipped = _metrics_skipped(record)
    assert len(skipped) == 1  # once, not at every evaluation
    assert "the model returned no logits" in skipped[0] and "return them from forward" in skipped[0]


def test_compute_metrics_without_labels_warns_once_naming_why(tmp_path):
    trainer = Trainer(model=Regressor(), args=_args(tmp_path), eval_dataset=rows(labels=False),
                      compute_metrics=lambda p: {"x": 1.0})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        metrics = trainer.evaluate()
    assert "eval_x" not in metrics
    skipped = _metrics_skipped(record)
    assert len(skipped) == 1 and "have no labels (looked for ['labels'])" in skipped[0]
    assert "label_names" in skipped[0]


def test_predict_on_unlabelled_data_and_evaluate_with_metrics_do_not_warn(tmp_path):
    trainer = Trainer(model=Regressor(), args=_args(tmp_path), eval_dataset=rows(),
                      compute_metrics=lambda p: {"n": float(len(p.label_ids))})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert trainer.evaluate()["eval_n"] == 10.0
        assert trainer.predict(rows(labels=False)).predictions.shape == (10,)  # test data without labels: normal
    assert _metrics_skipped(record) == []


# ------------------------------------------------------------------------------------------------ string labels
@pytest.mark.parametrize("column", ["label", "labels"])
@pytest.mark.parametrize("collator", [default_data_collator, DataCollatorWithPadding(None)], ids=["default", "pad"])
def test_string_labels_raise_naming_the_column_and_an_encoder(column, collator):
    features = [{"x": [0.0, 1.0, 2.0], column: "cat"}, {"x": [1.0, 2.0, 3.0], column: "dog"}]
    with pytest.raises(ValueError, match=rf"The '{column}' column holds strings \(e.g. 'cat'\).*"
                                         rf"class_encode_column\('{column}'\).*LabelEncoder"):
        collator(features)


def test_string_labels_in_training_raise_before_the_first_step(tmp_path):
    data = [{"x": r["x"], "labels": "positive" if r["labels"] > 0 else "negative"} for r in rows()]
    trainer = Trainer(model=Regressor(), args=_args(tmp_path, max_steps=2), train_dataset=data)
    with pytest.raises(ValueError, match="The 'labels' column holds strings"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_string_label_column_of_a_datasets_dataset(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = rows()
    ds = datasets.Dataset.from_dict({"x": [r["x"].tolist() for r in data],
                                     "label": ["pos" if r["labels"] > 0 else "neg" for r in data]})
    trainer = Trainer(model=Regressor(), args=_args(tmp_path, max_steps=2), train_dataset=ds)
    with pytest.raises(ValueError, match=r"The 'label' column holds strings.*class_encode_column\('label'\)"):
        trainer.train()
    encoded = ds.class_encode_column("label")  # the fix the message names works
    trainer = Trainer(model=Regressor(), args=_args(tmp_path, max_steps=2), train_dataset=encoded)
    assert trainer.train().global_step == 2


# ---------------------------------------------------------------------------------------------- save_total_limit
def test_save_total_limit_zero_is_refused_with_the_alternatives(tmp_path):
    with pytest.raises(ValueError, match=r"save_total_limit must be >= 1; use None to keep every checkpoint "
                                         r"\(what upstream silently does for 0\), or save_strategy='no'"):
        TrainingArguments(output_dir=str(tmp_path), save_total_limit=0)
    assert TrainingArguments(output_dir=str(tmp_path), save_total_limit=None).save_total_limit is None


@pytest.mark.slow  # over a second
def test_upstream_keeps_every_checkpoint_with_save_total_limit_zero(tmp_path):
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=str(tmp_path), save_total_limit=0, save_strategy="steps",
                                          save_steps=1, max_steps=3, per_device_train_batch_size=4,
                                          report_to="none", use_cpu=True, disable_tqdm=True)
    transformers.Trainer(model=Regressor(), args=args, train_dataset=rows()).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]


# ------------------------------------------------------------------------------------------ __len__ mismatches
class Stream(torch.utils.data.IterableDataset):
    """Yields ``n`` rows but says ``length``."""

    def __init__(self, n: int, length: int) -> None:
        self.data, self.length = rows(n), length

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return self.length


@pytest.mark.parametrize("n, length, said", [(6, 10, "yielded 6 examples"),
                                            (14, 10, "yielded more than 10 examples")])
def test_iterable_dataset_yielding_another_count_than_its_len_raises(tmp_path, n, length, said):
    trainer = Trainer(model=Regressor(), args=_args(tmp_path, num_train_epochs=2), train_dataset=Stream(n, length))
    with pytest.raises(ValueError, match=rf"{said} in one pass but its __len__ returns {length}.*max_steps"):
        trainer.train()


def test_iterable_dataset_with_a_true_len_trains_its_planned_steps(tmp_path):
    trainer = Trainer(model=Regressor(), args=_args(tmp_path, num_train_epochs=2), train_dataset=Stream(10, 10))
    assert trainer.train().global_step == 6  # 3 batches (4, 4, 2) per epoch
    with pytest.raises(ValueError, match="yielded 6 examples in one pass but its __len__ returns 10"):
        trainer.evaluate(Stream(6, 10))  # evaluation counts too
