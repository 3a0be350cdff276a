"""A model with a branch its forward never uses, trained under ``torchrun --nproc_per_node=2`` (gloo, CPU).

Usage: ``python -m torch.distributed.run --nproc_per_node=2 unused_params_job.py OUT_DIR``. Rank 0 writes
``OUT_DIR/result.json``: what happened with ``ddp_find_unused_parameters`` left unset (upstream's default: True
without gradient checkpointing) and with it set to False (DDP's own error).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)

from trainwell import Trainer, TrainingArguments  # noqa: E402


class Branchy(nn.Module):
    """``used`` predicts; ``unused`` never takes part in the forward (an auxiliary head left idle)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.used = nn.Linear(4, 1)
        self.unused = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pred = self.used(x).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels), "logits": pred}


class Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        x = torch.arange(4, dtype=torch.float32) * (i + 1) / 12
        return {"x": x, "labels": x.sum()}


def run(out: str, **kwargs: object) -> dict[str, object]:
    args = TrainingArguments(output_dir=out, use_cpu=True, per_device_train_batch_size=2, max_steps=3,
                             learning_rate=0.05, save_strategy="no", report_to="none", disable_tqdm=True,
                             logging_steps=1, **kwargs)
    trainer = Trainer(model=Branchy(), args=args, train_dataset=Rows())
    try:
        result = trainer.train()
    except RuntimeError as err:
        return {"error": str(err)[:300]}
    wrapped = trainer.model_wrapped
    return {"steps": result.global_step, "loss": result.training_loss,
            "find_unused": getattr(wrapped, "find_unused_parameters", None),
            "unused_weight": trainer.model.unused.weight.detach().tolist()}


def main() -> None:
    out = sys.argv[1]
    results = {"default": run(os.path.join(out, "default")),
               "explicit_false": run(os.path.join(out, "false"), ddp_find_unused_parameters=False)}
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out, "result.json"), "w") as fh:
            json.dump(results, fh)


if __name__ == "__main__":
    main()
