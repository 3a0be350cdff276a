"""The 2-rank job that ``test_kill_resume.py`` kills and relaunches (``torchrun --nproc_per_node=2``, gloo, CPU).

Usage: ``kill_job.py OUT_DIR BACKEND`` with BACKEND ``ddp``, ``fsdp``, ``zero2`` or ``zero3``. The job trains a
dropout MLP for 12 optimizer steps (2 epochs of 6, shuffled), saving every 3 steps, and resumes with
``resume_from_checkpoint=True`` whenever ``OUT_DIR`` holds a complete checkpoint (the requeue idiom). Kills:

- ``TRAINWELL_TEST_KILL_AT=<phase>:<step>:<rank>``: trainwell's test hook inside the save (checkpoint/commit.py);
- ``KILL_JOB_AT_STEP=<step>:<rank>``: SIGKILL that rank at the end of that optimizer step (between saves);
- ``KILL_JOB_IN_ENGINE_SAVE=<name>:<step>:<rank>``: SIGKILL that rank inside DeepSpeed's own
  ``engine.save_checkpoint`` of ``checkpoint-<step>``, right after DeepSpeed wrote that rank's file whose name
  contains ``<name>`` (``model_states``: its optimizer shard and ``latest`` are not written yet).

``KILL_JOB_SAVE_ON_EACH_NODE=1`` sets ``save_on_each_node=True`` (the multi-node tests). ``KILL_JOB_RESUME=auto`` resumes with ``resume_from_checkpoint="auto"`` instead; ``KILL_JOB_SLOW_CLEANUP=<seconds>``
delays rank 0's clean-up of interrupted saves (see :func:`slow_cleanup`).

When training ends, rank 0 writes ``OUT_DIR/final.safetensors`` (the consolidated weights) and ``OUT_DIR/result.json``
(``resumed_from``, ``global_step``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
from torch import nn

torch.set_num_threads(1)

from trainwell import Trainer, TrainerCallback, TrainingArguments, set_seed  # noqa: E402
from trainwell.trainer_utils import get_last_checkpoint  # noqa: E402
from jobs import backend_args, make_data, say  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


class DropoutMLP(nn.Module):
    """A classifier with dropout: an exact resume needs every rank's RNG."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.drop = nn.Dropout(0.3)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.fc2(self.drop(torch.tanh(self.fc1(x))))
        out = {"logits": logits}
        if labels is not None:
            out = {"loss": nn.functional.cross_entropy(logits, labels), **out}
        return out


class KillAtStep(TrainerCallback):
    """SIGKILL this rank at the end of the optimizer step named by ``KILL_JOB_AT_STEP``; prints the step this
    rank starts (or resumes) training at as ``RANK<r> BEGIN_STEP <n>``."""

    def __init__(self) -> None:
        spec = os.environ.get("KILL_JOB_AT_STEP", "")
        step, _, rank = spec.partition(":")
        self.step = int(step) if spec and int(rank) == RANK else None

    def on_train_begin(self, args, state, control, **kwargs):
        say(f"RANK{RANK} BEGIN_STEP {state.global_step}")
        return control

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)
        return control


def kill_in_engine_save() -> None:
    """Arm ``KILL_JOB_IN_ENGINE_SAVE`` (see the module docstring) on DeepSpeed's checkpoint engine of this rank."""
    spec = os.environ.get("KILL_JOB_IN_ENGINE_SAVE", "")
    if not spec:
        return
    name, step, rank = spec.split(":")
    if int(rank) != RANK:
        return
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    save = TorchCheckpointEngine.save

    def save_then_kill(self, state_dict, path: str) -> None:
        save(self, state_dict, path)
        if f"global_step{step}{os.sep}" in path and name in os.path.basename(path):
            os.kill(os.getpid(), signal.SIGKILL)

    TorchCheckpointEngine.save = save_then_kill


def slow_cleanup() -> None:
    """``KILL_JOB_SLOW_CLEANUP=<seconds>``: rank 0 waits that long before it promotes or removes the folders of
    interrupted saves at the start of ``train()`` (a slow file system), so that rank 1 lists the checkpoints first."""
    delay = float(os.environ.get("KILL_JOB_SLOW_CLEANUP", "0"))
    if not delay or RANK != 0:
        return
    import time

    from trainwell.checkpoint import layout

    recover = layout._recover_interrupted_replace

    def slow_recover(root: Path, *args: object) -> list[Path]:
        time.sleep(delay)
        return recover(root, *args)

    layout._recover_interrupted_replace = slow_recover


def main(out: Path, backend: str) -> None:
    kill_in_engine_save()
    slow_cleanup()
    set_seed(0)
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=4, num_train_epochs=2, learning_rate=0.05,
        warmup_steps=2, logging_steps=1, save_strategy="steps", save_steps=3, seed=0, report_to="none",
        disable_tqdm=True, max_grad_norm=1.0, save_on_each_node=os.environ.get("KILL_JOB_SAVE_ON_EACH_NODE") == "1",
        **backend_args(backend))
    trainer = Trainer(model=DropoutMLP(), args=args, train_dataset=make_data(), callbacks=[KillAtStep()])
    last = get_last_checkpoint(str(out))
    say(f"RANK{RANK} LAST_CHECKPOINT {last and Path(last).name}")
    resume = last is not None
    if os.environ.get("KILL_JOB_RESUME") == "auto":
        trainer.train(resume_from_checkpoint="auto")
    else:
        trainer.train(resume_from_checkpoint=True if resume else None)
    state = trainer.backend.full_state_dict() if trainer.backend.caps.sharded_state else None
    state = state if state is not None else trainer.model.state_dict()
    if RANK == 0:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(out / "final.safetensors"))
        resumed = [e for e in trainer.state.log_history if "loss" in e]
        result = {"global_step": trainer.state.global_step, "resumed": resume, "first_logged_step":
                  resumed[0]["step"] if resumed else None}
        (out / "result.json").write_text(json.dumps(result))
    sys.stdout.flush()
    import torch.distributed as dist

    dist.barrier()
    # DeepSpeed's communication threads can abort the interpreter's teardown; everything is written.
    os._exit(0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
