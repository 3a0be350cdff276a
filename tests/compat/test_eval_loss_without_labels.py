"""A model whose loss needs no labels (``label_names=[]`` with ``can_return_loss``, as TRL's ``RewardTrainer`` sets):
the evaluation still hands the predictions to ``compute_metrics``, with upstream's empty ``label_ids``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")


class PairScorer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.score = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.score(x)
        return {"loss": out.pow(2).mean(), "logits": out}


def _evaluate(trainer_cls: Any, args_cls: Any, out: str) -> tuple[dict[str, float], dict[str, Any]]:
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(4, generator=g)} for _ in range(10)]
    torch.manual_seed(0)
    seen: dict[str, Any] = {}

    def compute_metrics(prediction: Any) -> dict[str, float]:
        seen["predictions"], seen["label_ids"] = prediction.predictions, prediction.label_ids
        return {"mean_score": float(prediction.predictions.mean())}

    args = args_cls(out, per_device_eval_batch_size=4, report_to="none", label_names=[], disable_tqdm=True,
                    use_cpu=True)
    trainer = trainer_cls(model=PairScorer(), args=args, eval_dataset=data, compute_metrics=compute_metrics)
    trainer.can_return_loss = True
    return trainer.evaluate(), seen


def test_compute_metrics_runs_on_a_loss_without_labels_as_upstream(tmp_path: Any) -> None:
    from trainwell import Trainer, TrainingArguments

    theirs, their_seen = _evaluate(transformers.Trainer, transformers.TrainingArguments, str(tmp_path / "up"))
    ours, our_seen = _evaluate(Trainer, TrainingArguments, str(tmp_path / "tw"))
    assert "eval_mean_score" in theirs
    assert ours["eval_mean_score"] == pytest.approx(theirs["eval_mean_score"], rel=1e-6)
    assert ours["eval_loss"] == pytest.approx(theirs["eval_loss"], rel=1e-6)
    assert our_seen["predictions"].shape == their_seen["predictions"].shape == (10, 2)
    assert tuple(our_seen["label_ids"]) == tuple(their_seen["label_ids"]) == ()
