"""A small deterministic training job that tests/checkpoint/test_resume.py runs as a subprocess, and interrupts.

Usage::

    python tests/checkpoint/resume_job.py OUTPUT_DIR [--resume] [--kill-at-step N] [--kill-in-save N] [--term-at-step N]

The job trains a dropout MLP on a fixed random classification set (CPU, shuffling on, gradient accumulation 2,
linear schedule with warmup, AdamW, logging every step, a checkpoint every 3 steps, an evaluation every 3 steps,
3 epochs of 6 optimizer steps, the last step of each epoch accumulating a single micro-batch).

- ``--resume``: ``train(resume_from_checkpoint=True)`` when ``get_last_checkpoint(OUTPUT_DIR)`` finds one.
- ``--kill-at-step N``: SIGKILL this process at the end of optimizer step N (before its log and checkpoint).
- ``--kill-in-save N``: SIGKILL this process while checkpoint N is being written: after the weights and half of
  ``optimizer.pt`` are on disk, before the completion marker and the rename.
- ``--term-at-step N``: send this process SIGTERM at the end of step N (a cluster preempting the job).

On a normal end the job writes ``OUTPUT_DIR/final.safetensors`` (the weights) and, always when ``train()``
returns, ``OUTPUT_DIR/log_history.json`` and ``OUTPUT_DIR/result.json`` (``preempted``, ``global_step``,
``getitem_calls``: how many dataset items this process read for training).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

# the checkout's trainwell first: the repository root is the folder above tests/, however deep this file is
sys.path.insert(0, str(next(p for p in Path(__file__).resolve().parents if p.name == "tests").parent))

from trainwell import Trainer, TrainerCallback, TrainingArguments, TrainingPreempted, set_seed
from trainwell.trainer_utils import get_last_checkpoint

NUM_TRAIN = 44  # 11 micro-batches of 4 per epoch: 5 full accumulation groups and a last one of 1
NUM_EVAL = 12
FEATURES = 8
CLASSES = 3


class CountingDataset(torch.utils.data.Dataset):
    """Map-style dataset of ``{"x", "labels"}`` rows that counts its ``__getitem__`` calls."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, FEATURES, generator=generator)
        self.y = torch.randint(0, CLASSES, (count,), generator=generator)
        self.calls = 0

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.calls += 1
        return {"x": self.x[index], "labels": self.y[index]}


class DropoutMLP(nn.Module):
    """Two-layer classifier with dropout (so the resumed run must restore the torch RNG exactly)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(FEATURES, 32), nn.GELU(), nn.Dropout(0.3), nn.Linear(32, CLASSES))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out


class Interrupt(TrainerCallback):
    """Kill (SIGKILL) or preempt (SIGTERM) this process at the end of a chosen optimizer step."""

    def __init__(self, kill_at: int | None, term_at: int | None) -> None:
        self.kill_at = kill_at
        self.term_at = term_at

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if state.global_step == self.term_at:
            os.kill(os.getpid(), signal.SIGTERM)
        return control


def kill_while_saving(step: int) -> None:
    """Make the save of ``checkpoint-<step>`` die half-way through writing ``optimizer.pt``."""
    from trainwell.checkpoint import manager

    original = manager._torch_save

    def dying_save(obj, path: Path) -> None:
        original(obj, path)
        if path.name == "optimizer.pt" and f"checkpoint-{step}-" in path.parent.name:
            size = path.stat().st_size
            with open(path, "r+b") as handle:
                handle.truncate(size // 2)
            os.kill(os.getpid(), signal.SIGKILL)

    manager._torch_save = dying_save


def build_args(output_dir: str) -> TrainingArguments:
    """The job's fixed configuration."""
    return TrainingArguments(
        output_dir=output_dir, use_cpu=True, seed=1234, num_train_epochs=3,
        per_device_train_batch_size=4, per_device_eval_batch_size=4, gradient_accumulation_steps=2,
        learning_rate=2e-2, weight_decay=0.01, optim="adamw_torch", lr_scheduler_type="linear", warmup_steps=3,
        max_grad_norm=1.0, logging_strategy="steps", logging_steps=1, save_strategy="steps", save_steps=3,
        save_total_limit=2, eval_strategy="steps", eval_steps=3, report_to="none", disable_tqdm=True,
        dataloader_num_workers=0,
    )


def parse(argv: list[str]) -> argparse.Namespace:
    """Command-line options (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--kill-in-save", type=int, default=None)
    parser.add_argument("--term-at-step", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Train (or resume) once; write the outputs described in the module docstring."""
    options = parse(argv)
    torch.set_num_threads(1)
    if options.kill_in_save is not None:
        kill_while_saving(options.kill_in_save)
    train_data = CountingDataset(NUM_TRAIN, seed=0)
    eval_data = CountingDataset(NUM_EVAL, seed=1)
    args = build_args(options.output_dir)
    set_seed(args.seed)  # the initial weights must not depend on the process
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=train_data, eval_dataset=eval_data,
                      callbacks=[Interrupt(options.kill_at_step, options.term_at_step)])
    # The usual requeue idiom: resume when a checkpoint exists (a kill before the first save starts over).
    resume = options.resume and get_last_checkpoint(options.output_dir) is not None
    status = 0
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
    except TrainingPreempted as stop:  # a script that goes on after the preemption, then exits with its status
        status = int(stop.code)
    out = Path(options.output_dir)
    preempted = bool(getattr(trainer, "preempted", False))
    if not preempted:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, str(out / "final.safetensors"))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1), encoding="utf-8")
    result = {"preempted": preempted, "global_step": trainer.state.global_step, "getitem_calls": train_data.calls}
    (out / "result.json").write_text(json.dumps(result), encoding="utf-8")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
