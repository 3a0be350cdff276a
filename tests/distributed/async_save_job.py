"""The 2-rank DDP job of ``test_async_save_ranks.py`` (``torchrun --nproc_per_node=2``, gloo, CPU).

Usage: ``async_save_job.py OUT_DIR MODE`` with MODE ``sync``, ``async`` (``async_save``), ``sync-fsdp``,
``async-fsdp`` (FSDP2 ``full_shard``) or ``refused`` (builds a Trainer with ``async_save`` on a backend that refuses
it and prints ``RANK<r> REFUSED <backend> <error>``). A dropout MLP trains
12 optimizer steps (2 epochs of 6, shuffled), saving every 3 steps, and resumes with ``resume_from_checkpoint=True``
when ``OUT_DIR`` holds a checkpoint. Environment:

- ``TRAINWELL_TEST_KILL_AT=<phase>:<step>:<rank>``: trainwell's test hook in the commit (here on the saver thread);
- ``FAIL_RNG_WRITE_AT=<step>:<rank>``: that rank's write of its RNG file into ``checkpoint-<step>`` raises OSError
  (a full disk, on the background thread);
- ``FAIL_ROTATION_AT=<step>:<rank>``: that rank's rotation after ``checkpoint-<step>`` raises (a local failure);
- ``SYNC_STEPS=<n>``: the trainer's ``preemption_sync_steps`` (how often the ranks agree on a stop or a failure);
- ``JOIN_SAVE_AT=<n>``: before step n+1 each rank waits for its background save (so the test knows when it ended);
- ``TERM_AT_STEP=<step>:<rank>``: that rank sends itself SIGTERM at the end of that step (a preemption); the job
  then prints ``RANK<r> PREEMPTED <step> <newest complete checkpoint> <saver busy>`` and writes no final weights.

Each rank prints ``RANK<r> BEGIN_STEP <n>`` when training starts and ``RANK<r> CHECKPOINT_ERROR <step> <message>``
when ``train()`` raises CheckpointError. At the end rank 0 writes ``OUT_DIR/final.safetensors``.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)

from trainwell import (Trainer, TrainerCallback, TrainingArguments, TrainingPreempted, get_last_checkpoint,  # noqa: E402
                       set_seed)
from trainwell.checkpoint import manager as checkpoint_manager  # noqa: E402
from trainwell.checkpoint.layout import CheckpointError  # noqa: E402
from jobs import make_data, say  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


class DropoutMLP(nn.Module):
    """A regressor with dropout: an exact resume needs every rank's RNG."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.fc2(self.drop(torch.tanh(self.fc1(x)))), labels)}


class Begin(TrainerCallback):
    """Prints the step training starts at; with ``JOIN_SAVE_AT=<n>``, lets the background save end before step n+1."""

    def __init__(self) -> None:
        self.trainer = None
        self.join_at = int(os.environ.get("JOIN_SAVE_AT", "-1"))

    def on_train_begin(self, args, state, control, **kwargs):
        say(f"RANK{RANK} BEGIN_STEP {state.global_step}")

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.join_at:
            self.trainer._tw_checkpoints.async_saver.join()

    def on_step_end(self, args, state, control, **kwargs):
        if os.environ.get("TERM_AT_STEP") == f"{state.global_step}:{RANK}":
            os.kill(os.getpid(), signal.SIGTERM)


def fail_rng_write(spec: str) -> None:
    """Make this rank's RNG file write of checkpoint ``step`` raise (see the module docstring)."""
    step, _, rank = spec.partition(":")
    if int(rank) != RANK:
        return
    original = checkpoint_manager._torch_save

    def failing(obj, path):
        if path.name.startswith("rng_state") and f"checkpoint-{step}-" in path.parent.name:
            raise OSError(28, f"No space left on device (test, rank {RANK})")
        original(obj, path)

    checkpoint_manager._torch_save = failing


def fail_rotation(spec: str) -> None:
    """Make this rank's rotation after checkpoint ``step`` raise (a failure only that rank knows of)."""
    step, _, rank = spec.partition(":")
    if int(rank) != RANK:
        return
    original = checkpoint_manager.CheckpointManager.rotate

    def failing(self, *args, **kwargs):
        if (self.output_dir / f"checkpoint-{step}").is_dir():
            raise OSError(f"rotation failed (test, rank {RANK})")
        return original(self, *args, **kwargs)

    checkpoint_manager.CheckpointManager.rotate = failing


def refused(out: Path) -> None:
    """Build a Trainer with async_save=True for each backend whose engine writes the checkpoint; print the error."""
    for name, extra in (("DDPBackend", {"sharded_ddp": "simple"}),):
        args = TrainingArguments(output_dir=str(out), use_cpu=True, report_to="none", async_save=True, **extra)
        try:
            Trainer(model=DropoutMLP(), args=args, train_dataset=make_data())
        except ValueError as err:
            say(f"RANK{RANK} REFUSED {name} {err}")


def main(out: Path, mode: str) -> None:
    if mode == "refused":
        return refused(out)
    if os.environ.get("FAIL_RNG_WRITE_AT"):
        fail_rng_write(os.environ["FAIL_RNG_WRITE_AT"])
    if os.environ.get("FAIL_ROTATION_AT"):
        fail_rotation(os.environ["FAIL_ROTATION_AT"])
    set_seed(0)
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=4, num_train_epochs=2, learning_rate=0.05,
        warmup_steps=2, logging_steps=1, save_strategy="steps", save_steps=3, seed=0, report_to="none",
        disable_tqdm=True, max_grad_norm=1.0, async_save=mode.startswith("async"),
        **({"fsdp": "full_shard"} if mode.endswith("-fsdp") else {}))
    begin = Begin()
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=make_data(), callbacks=[begin])
    begin.trainer = trainer
    if os.environ.get("SYNC_STEPS"):
        trainer.preemption_sync_steps = int(os.environ["SYNC_STEPS"])
    resume = get_last_checkpoint(str(out)) is not None
    try:
        trainer.train(resume_from_checkpoint=True if resume else None)
    except CheckpointError as err:
        say(f"RANK{RANK} CHECKPOINT_ERROR {trainer.state.global_step} {err}")
        sys.exit(3)
    except TrainingPreempted:  # a script that goes on after a preemption (it would exit 143 otherwise)
        pass
    if trainer.preempted:  # the preemption save must be committed when train() raises
        from trainwell.checkpoint.layout import list_complete_checkpoints

        newest = list_complete_checkpoints(out)[-1].name
        say(f"RANK{RANK} PREEMPTED {trainer.state.global_step} {newest} {trainer._tw_checkpoints.async_saver.busy}")
        return
    state = trainer.backend.full_state_dict() if trainer.backend.caps.sharded_state else trainer.model.state_dict()
    if RANK == 0:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in state.items()},
                  str(out / "final.safetensors"))
    say(f"RANK{RANK} DONE {trainer.state.global_step}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
