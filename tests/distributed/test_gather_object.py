"""``eval_use_gather_object``: under 2 ranks (torchrun, gloo) the non-tensor outputs of each rank are gathered too.

The file is both the test and the job (``python test_gather_object.py OUT`` under torchrun); rank 0 writes what it got.
"""

from __future__ import annotations

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


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        pred = self.lin(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


def job(out: Path) -> None:
    from trainwell import Trainer, TrainingArguments
    from trainwell.loops.gather import gather_parts

    rank = int(os.environ["RANK"])
    data = [{"x": torch.full((3,), float(i)), "labels": torch.tensor(float(i))} for i in range(10)]
    results: dict[str, Any] = {}
    for flag in (False, True):
        args = TrainingArguments(str(out / str(flag)), eval_use_gather_object=flag, per_device_eval_batch_size=2,
                                 report_to="none", use_cpu=True, disable_tqdm=True)
        trainer = Trainer(model=Net(), args=args, eval_dataset=data)
        results[f"eval_loss_{flag}"] = trainer.evaluate()["eval_loss"]
        parts = gather_parts((torch.tensor([rank]), f"rank-{rank}", {"tag": [rank, "x"]}),
                             gather_objects=args.eval_use_gather_object)
        results[f"parts_{flag}"] = [[int(p[0]), p[1], p[2]] for p in parts]
    finish(out / "results.json", results)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from helpers.launch import run_json, torchrun  # here: the job (this file) runs without tests/ on sys.path

    out = tmp_path_factory.mktemp("gather_object")
    return run_json(torchrun(Path(__file__).resolve(), out), out / "results.json", "the 2-rank job", timeout=TIMEOUT_S)


def test_objects_are_gathered_only_when_asked(results) -> None:
    assert results["parts_True"] == [[0, "rank-0", {"tag": [0, "x"]}], [1, "rank-1", {"tag": [1, "x"]}]]
    # off (the default): tensors are gathered, other leaves stay this rank's (rank 0 wrote these)
    assert results["parts_False"] == [[0, "rank-0", {"tag": [0, "x"]}], [1, "rank-0", {"tag": [0, "x"]}]]


def test_tensor_results_do_not_change(results) -> None:
    assert results["eval_loss_True"] == results["eval_loss_False"]


if __name__ == "__main__":
    job(Path(sys.argv[1]))
