"""A 2-rank DDP run interrupted and resumed logs exactly what the uninterrupted run logs.

Every rank keeps its own running loss between two logs; a checkpoint saves all of them (``tr_loss_per_rank`` in
``data_state.json``) and each rank resumes its own, so the logging window that spans the interruption and the final
``train_loss`` are bit-identical, not just the weights. The file is both the test and the job: torchrun runs it as a
script (``python test_resume_logging.py OUT``), and the test compares what rank 0 wrote.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from jobs import finish

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT_S = 300


# ------------------------------------------------------------------------------------------------ the job
class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.hidden = nn.Linear(4, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x, labels=None):
        pred = self.head(torch.tanh(self.hidden(x))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


def _data(n: int = 48) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    y = (x @ torch.tensor([0.5, -1.0, 2.0, 0.3])).sin() + 0.1 * torch.randn(n, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _run(out: Path, ga: int, resume: str | None = None) -> dict[str, Any]:
    from trainwell import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4 // ga, gradient_accumulation_steps=ga,
                             num_train_epochs=2, learning_rate=0.05, logging_steps=4, save_strategy="steps",
                             save_steps=3, report_to="none", disable_tqdm=True, seed=0, use_cpu=True)
    trainer = Trainer(model=Net(), args=args, train_dataset=_data())
    result = trainer.train(resume_from_checkpoint=resume)
    return {"losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "steps": [e["step"] for e in trainer.state.log_history if "loss" in e],
            "train_loss": result.training_loss, "global_step": result.global_step,
            "weights": {k: v.reshape(-1).tolist() for k, v in trainer.model.state_dict().items()}}


def job(out: Path) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, Any] = {}
    for ga in (1, 2):
        full = _run(out / f"ga{ga}", ga)
        data_state = json.loads((out / f"ga{ga}" / "checkpoint-6" / "data_state.json").read_text())
        resumed = {name: _run(out / f"ga{ga}-from-{name}", ga, resume=str(out / f"ga{ga}" / name))
                   for name in ("checkpoint-3", "checkpoint-6", "checkpoint-9")}
        results[f"ga{ga}"] = {"full": full, "resumed": resumed, "data_state": data_state}
    finish(out / "results.json", results)


# ------------------------------------------------------------------------------------------------ the test
@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from helpers.launch import run_json, torchrun  # here: the job (this file) runs without tests/ on sys.path

    out = tmp_path_factory.mktemp("resume_logging")
    return run_json(torchrun(Path(__file__).resolve(), out), out / "results.json", "the 2-rank job", timeout=TIMEOUT_S)


@pytest.mark.parametrize("ga", [1, 2])
def test_every_rank_running_loss_is_saved(results, ga):
    data_state = results[f"ga{ga}"]["data_state"]
    per_rank = data_state["tr_loss_per_rank"]
    assert len(per_rank) == 2 and per_rank[0] != per_rank[1]  # the ranks see different data
    assert data_state["tr_loss"] == per_rank[0] and data_state["last_logged_step"] == 4


@pytest.mark.parametrize("checkpoint", ["checkpoint-3", "checkpoint-6", "checkpoint-9"])
@pytest.mark.parametrize("ga", [1, 2])
def test_resumed_run_logs_exactly_the_uninterrupted_values(results, ga, checkpoint):
    full, resumed = results[f"ga{ga}"]["full"], results[f"ga{ga}"]["resumed"][checkpoint]
    assert full["global_step"] == resumed["global_step"] == 12
    assert resumed["steps"] == full["steps"] == [4, 8, 12]
    assert resumed["losses"] == full["losses"]  # bit-exact, the window spanning the resume included
    assert resumed["train_loss"] == full["train_loss"]
    assert resumed["weights"] == full["weights"]


if __name__ == "__main__":
    job(Path(sys.argv[1]))
