"""Evaluation keeps every row of a batch whose collator changes the leading dimension, as upstream does.

Preference collators (TRL's ``RewardTrainer``/``DPOTrainer``) put a batch's chosen and rejected sequences into one
tensor of twice the samples. The loss of every batch must count, and every row of the predictions and labels must
reach ``compute_metrics``: only the placeholders of a distributed evaluation's last batch are dropped, never rows
counted against the dataset's length. Oracle: ``transformers.Trainer`` on the same body; where upstream itself cuts
rows (a short last batch: accelerate's ``gather_for_metrics`` keeps ``len(dataset) % batch`` rows of it), the
ground truth (a direct forward over every batch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import trainwell

transformers = pytest.importorskip("transformers")

BATCH = 4


class PairScorer(nn.Module):
    """Scores each row; the loss is the pairwise preference loss of the batch's first half against its second."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        scores = self.linear(x).squeeze(-1)
        chosen, rejected = scores.chunk(2)
        loss = -nn.functional.logsigmoid(chosen - rejected).mean() + ((scores - labels) ** 2).mean()
        return {"loss": loss, "logits": scores}


def pairs(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(n)
    return [{"chosen": torch.randn(3, generator=g), "rejected": torch.randn(3, generator=g)} for _ in range(n)]


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Chosen rows first, then rejected rows: a batch of 2 * len(items) rows; labels 1 and 0."""
    x = torch.stack([item["chosen"] for item in items] + [item["rejected"] for item in items])
    labels = torch.cat([torch.ones(len(items)), torch.zeros(len(items))])
    return {"x": x, "labels": labels}


def ground_truth(data: list[dict[str, torch.Tensor]]) -> tuple[float, np.ndarray, np.ndarray]:
    """eval_loss (the mean of the batch losses weighted by their samples), predictions and labels of every row."""
    model, losses, weights, preds, labels = PairScorer(), [], [], [], []
    with torch.no_grad():
        for start in range(0, len(data), BATCH):
            batch = collate(data[start:start + BATCH])
            out = model(**batch)
            losses.append(float(out["loss"]))
            weights.append(len(data[start:start + BATCH]))
            preds.append(out["logits"].numpy())
            labels.append(batch["labels"].numpy())
    return float(np.average(losses, weights=weights)), np.concatenate(preds), np.concatenate(labels)


def evaluate(module: Any, tmp_path: Path, data: list[dict[str, torch.Tensor]]) -> tuple[dict[str, float], dict]:
    seen: dict[str, np.ndarray] = {}

    def metrics(pred: Any) -> dict[str, float]:
        seen["predictions"], seen["labels"] = np.asarray(pred.predictions), np.asarray(pred.label_ids)
        return {"rows": float(len(pred.predictions)), "mean_score": float(np.mean(pred.predictions))}

    args = module.TrainingArguments(output_dir=str(tmp_path / module.__name__), per_device_eval_batch_size=BATCH,
                                    report_to="none", use_cpu=True, remove_unused_columns=False)
    trainer = module.Trainer(model=PairScorer(), args=args, data_collator=collate, compute_metrics=metrics)
    return trainer.evaluate(data), seen


def test_doubled_rows_count_in_the_loss_and_reach_compute_metrics_as_upstream(tmp_path: Path) -> None:
    data = pairs(8)  # 2 batches of 4 pairs: 8 rows each
    loss, preds, labels = ground_truth(data)
    ours, seen = evaluate(trainwell, tmp_path, data)
    upstream, _ = evaluate(transformers, tmp_path, data)
    assert ours["eval_loss"] == pytest.approx(loss, rel=1e-6)
    assert ours["eval_loss"] == pytest.approx(upstream["eval_loss"], rel=1e-6)
    assert ours["eval_rows"] == upstream["eval_rows"] == 16
    assert ours["eval_mean_score"] == pytest.approx(upstream["eval_mean_score"], rel=1e-6)
    np.testing.assert_allclose(seen["predictions"], preds, rtol=1e-6)
    np.testing.assert_array_equal(seen["labels"], labels)


def test_a_short_last_batch_keeps_every_row(tmp_path: Path) -> None:
    data = pairs(10)  # batches of 4, 4 and 2 pairs: 8, 8 and 4 rows
    loss, preds, labels = ground_truth(data)
    ours, seen = evaluate(trainwell, tmp_path, data)
    upstream, _ = evaluate(transformers, tmp_path, data)
    assert ours["eval_loss"] == pytest.approx(loss, rel=1e-6)
    assert ours["eval_loss"] == pytest.approx(upstream["eval_loss"], rel=1e-6)
    # upstream keeps len(dataset) % batch = 2 of the last batch's 4 rows; every row is the truth
    assert upstream["eval_rows"] == 18 and ours["eval_rows"] == 20
    np.testing.assert_allclose(seen["predictions"], preds, rtol=1e-6)
    np.testing.assert_array_equal(seen["labels"], labels)
