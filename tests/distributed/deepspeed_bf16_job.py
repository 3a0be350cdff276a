"""2-rank DeepSpeed ZeRO-2 with ``bf16=True`` and float inputs (run by ``test_deepspeed_bf16.py`` under torchrun).

Without the input cast the first forward fails with "mat1 and mat2 must have the same dtype" (the engine runs the
model in bf16, the collator yields float32). Rank 0 writes what it saw as JSON to ``argv[1]``; ``argv[2]`` is the
work folder.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)

from trainwell import Trainer, TrainingArguments  # noqa: E402


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.seen: list[str] = []

    def forward(self, x: torch.Tensor, steps: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        self.seen.append(f"{x.dtype}/{steps.dtype}")
        pred = self.fc(x).squeeze(-1)
        return {"loss": F.mse_loss(pred.float(), labels.float()), "logits": pred}


def main() -> None:
    out, work = sys.argv[1], sys.argv[2]
    rank = int(os.environ.get("RANK", "0"))
    result: dict = {}
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(16, 4, generator=gen)
        data = [{"x": x[i], "steps": torch.tensor(i), "labels": x[i].sum()} for i in range(16)]
        config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                  "gradient_accumulation_steps": "auto", "steps_per_print": 10 ** 9, "bf16": {"enabled": "auto"},
                  "zero_optimization": {"stage": 2}}
        args = TrainingArguments(output_dir=os.path.join(work, "out"), deepspeed=config, bf16=True, max_steps=2,
                                 per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                                 report_to="none", disable_tqdm=True, use_cpu=True)
        model = Regressor()
        trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=data[:8])
        trainer.train()
        metrics = trainer.evaluate()
        result = {"seen": sorted(set(model.seen)), "param_dtype": str(next(model.parameters()).dtype),
                  "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
                  "eval_loss": metrics["eval_loss"]}
    except Exception:  # reported to the test, which shows it
        result = {"error": traceback.format_exc()}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
