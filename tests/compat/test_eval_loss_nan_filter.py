"""``eval_loss`` leaves non-finite batch losses out under ``logging_nan_inf_filter`` (the default), as upstream does.

The same script runs against ``transformers.Trainer`` (the oracle) and trainwell; both must report the same
``eval_loss`` with the filter on and off.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

import trainwell

transformers = pytest.importorskip("transformers")


class SometimesNaN(nn.Module):
    """Regression whose loss is NaN (or inf) for batches that contain a marked sample."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        pred = self.linear(x).squeeze(-1)
        loss = nn.functional.mse_loss(pred, labels)
        if bool((x[:, 0] > 100).any()):
            loss = loss * float("nan")
        if bool((x[:, 0] < -100).any()):
            loss = loss + float("inf")
        return {"loss": loss, "logits": pred}


def dataset() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(11, 2, generator=g)
    x[4, 0], x[9, 0] = 1000.0, -1000.0  # batch 1 (samples 3-5) is NaN, batch 3 (9-10, short) is inf
    return [{"x": x[i], "labels": x[i].sum()} for i in range(11)]


def run(module, tmp_path: Path, nan_filter: bool) -> float:
    torch.manual_seed(0)
    args = module.TrainingArguments(output_dir=str(tmp_path / module.__name__), per_device_eval_batch_size=3,
                                    report_to="none", use_cpu=True, logging_nan_inf_filter=nan_filter)
    trainer = module.Trainer(model=SometimesNaN(), args=args)
    return trainer.evaluate(dataset())["eval_loss"]


@pytest.mark.parametrize("nan_filter", [True, False])
def test_eval_loss_matches_upstream(tmp_path: Path, nan_filter: bool) -> None:
    ours, upstream = run(trainwell, tmp_path, nan_filter), run(transformers, tmp_path, nan_filter)
    if nan_filter:
        assert math.isfinite(ours)
        assert ours == pytest.approx(upstream, rel=1e-6)
    else:
        assert math.isnan(ours) and math.isnan(upstream)
