"""Gradient accumulation over 2 DDP ranks updates like one process with one big batch of the same examples.

A token LM whose forward takes ``num_items_in_batch``, with uneven ``-100`` masks (so the ranks hold different
numbers of target tokens), and a plain per-batch-mean regression; 44 examples, so the epoch's last window is short.
With ``average_tokens_across_devices=True`` (upstream's default) the item count is summed over the ranks and the
2-rank run equals the 1-process big batch; the regression does too whatever the option. The file is both the test
and the job (torchrun runs it as a script; so does the 1-process reference).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from jobs import finish

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT_S = 300
N = 44  # 5 full windows of 8 examples and a short one of 4


# ------------------------------------------------------------------------------------------------ the job
class TokenLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(9, 6)
        self.head = nn.Linear(6, 9)

    def forward(self, input_ids, labels=None, num_items_in_batch=None):
        logits = self.head(self.embed(input_ids))
        total = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum")
        return {"loss": total / (num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()),
                "logits": logits}


class Regression(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(6, 1)

    def forward(self, input_ids, labels=None):
        pred = self.linear(input_ids.float()).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels.float().mean(-1).clamp(min=0)), "logits": pred}


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 9, (N, 6), generator=g)
    labels = torch.randint(0, 9, (N, 6), generator=g)
    for i in range(N):
        labels[i, : int(torch.randint(0, 6, (1,), generator=g))] = -100  # 1 to 6 target tokens per example
    return [{"input_ids": ids[i], "labels": labels[i]} for i in range(N)]


def _run(out: Path, model: nn.Module, world: int, average: bool) -> dict[str, Any]:
    from trainwell import Trainer, TrainingArguments

    ga = 2 if world > 1 else 1
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=8 // (world * ga),
                             gradient_accumulation_steps=ga, num_train_epochs=2, optim="sgd", learning_rate=0.5,
                             lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none",
                             disable_tqdm=True, seed=0, use_cpu=True, average_tokens_across_devices=average)
    trainer = Trainer(model=model, args=args, train_dataset=_data())
    result = trainer.train()
    return {"losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
            "grad_norms": [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e],
            "train_loss": result.training_loss,
            "weights": {k: v.reshape(-1).tolist() for k, v in trainer.model.state_dict().items()}}


def job(out: Path) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "lm_average": _run(out / "lm_average", TokenLM(), world, True),
        "lm_local": _run(out / "lm_local", TokenLM(), world, False),
        "regression": _run(out / "regression", Regression(), world, True),
    }
    finish(out / f"results_{world}.json", results)


# ------------------------------------------------------------------------------------------------ the test
@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Any]:
    from helpers.launch import one_and_two_ranks  # here: the job (this file) runs without tests/ on sys.path

    return one_and_two_ranks(Path(__file__).resolve(), tmp_path_factory.mktemp("accumulation_ranks"), timeout=TIMEOUT_S)


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= 1e-5 + 1e-5 * abs(y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["lm_average", "regression"])
def test_two_ranks_with_accumulation_equal_one_big_batch(results, name):
    two, one = results[2][name], results[1][name]
    assert len(two["losses"]) == len(one["losses"]) == 12  # 6 windows a epoch, the last one short
    assert _close(two["losses"], one["losses"]) and _close(two["grad_norms"], one["grad_norms"])
    assert abs(two["train_loss"] - one["train_loss"]) <= 1e-5
    for key, weights in one["weights"].items():
        assert _close(two["weights"][key], weights), key


def test_without_averaging_tokens_the_ranks_weigh_alike(results):
    # each rank normalises by its own token count, so a rank with fewer tokens weighs more than one big batch would
    two, one = results[2]["lm_local"], results[1]["lm_local"]
    assert not _close(two["losses"], one["losses"])
    assert one["losses"] == results[1]["lm_average"]["losses"]  # one process: the option changes nothing


if __name__ == "__main__":
    job(Path(sys.argv[1]))
