"""The job of ``test_elastic_resume.py``: train, or resume a checkpoint written by another number of processes.

Usage: ``elastic_job.py ROOT BACKEND RUN...`` under ``torchrun --nproc_per_node=N`` (N = 1 or 2), BACKEND ``ddp``,
``fsdp``, ``zero2`` or ``zero3``. Each RUN is ``NAME`` (train from scratch into ``ROOT/BACKEND/NAME``) or
``NAME=CHECKPOINT`` (resume from the folder ``ROOT/CHECKPOINT`` into ``ROOT/BACKEND/NAME``). Every run has the same global batch
of 8 samples whatever N (4 per process, ``gradient_accumulation_steps = 2 // N``) and trains 12 optimizer steps
(2 shuffled epochs of 6), saving every 6. The model has no dropout: a resized job cannot draw the masks the old
size drew (the batch is split differently), so exactness is only defined without in-step randomness.

Rank 0 writes ``ROOT/BACKEND/NAME/final.safetensors`` (the consolidated weights) and ``.../result.json``
(``global_step``, ``world_size``); a refused resume (every rank refuses it before loading anything) writes
``.../error.txt`` (the exception) instead, and the job goes on with the next RUN.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
from torch import nn

torch.set_num_threads(1)

from trainwell import Trainer, TrainingArguments, set_seed  # noqa: E402
from jobs import backend_args, make_data  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class Net(nn.Module):
    """Two layers and a norm; no dropout (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.norm = nn.LayerNorm(16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.fc2(self.norm(torch.tanh(self.fc1(x))))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def train(root: Path, backend: str, name: str, resume: str | None) -> None:
    out = root / backend
    set_seed(0)
    args = TrainingArguments(
        output_dir=str(out / name), use_cpu=True, per_device_train_batch_size=4,
        gradient_accumulation_steps=max(1, 2 // WORLD), num_train_epochs=2, learning_rate=0.05, warmup_steps=2,
        logging_steps=1, save_strategy="steps", save_steps=6, seed=0, report_to="none", disable_tqdm=True,
        max_grad_norm=1.0, **backend_args(backend))
    trainer = Trainer(model=Net(), args=args, train_dataset=make_data())
    try:
        trainer.train(resume_from_checkpoint=str(root / resume) if resume else None)
    except ValueError as err:  # a refused resume: the test reads the message
        if RANK == 0:
            (out / name).mkdir(parents=True, exist_ok=True)
            (out / name / "error.txt").write_text(f"{type(err).__name__}: {err}")
        return
    state = trainer.backend.full_state_dict() if trainer.backend.caps.sharded_state else None
    state = state if state is not None else trainer.model.state_dict()
    if RANK == 0:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(out / name / "final.safetensors"))
        result = {"global_step": trainer.state.global_step, "world_size": WORLD}
        (out / name / "result.json").write_text(json.dumps(result))


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def main(out: Path, backend: str, runs: list[str]) -> None:
    for run in runs:
        name, _, resume = run.partition("=")
        train(out, backend, name, resume or None)
    sys.stdout.flush()
    _barrier()
    # DeepSpeed's communication threads can abort the interpreter's teardown; everything is written.
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
