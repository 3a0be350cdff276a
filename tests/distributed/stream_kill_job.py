"""The 2-rank job of ``test_stream_resume_ranks.py``: a stream that can say its position, split over the ranks.

Usage: ``stream_kill_job.py OUT_DIR`` (``torchrun --nproc_per_node=2``, gloo, CPU). Each rank reads its own share of
a stream (example ``i`` goes to rank ``i % 2``) that keeps its position (``state_dict``/``load_state_dict``); the job
trains 8 steps of batch 3, saving every 3, and resumes with ``resume_from_checkpoint=True`` whenever ``OUT_DIR``
holds a complete checkpoint. ``KILL_JOB_AT_STEP=<step>:<rank>`` SIGKILLs that rank at the end of that step. Each rank
prints ``RANK<r> BEGIN_STEP <n>`` and, at the end, ``RANK<r> FIRST_READ <i>`` (the first example index its stream
read in this launch); rank 0 writes ``OUT_DIR/final.safetensors``.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)

from trainwell import Trainer, TrainerCallback, TrainingArguments, set_seed  # noqa: E402
from trainwell.trainer_utils import get_last_checkpoint  # noqa: E402
from jobs import say  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))


class RankStream(torch.utils.data.IterableDataset):
    """This rank's share of an endless stream of deterministic rows; ``read`` lists the indices it produced."""

    def __init__(self) -> None:
        self.next_index, self.read = RANK, []

    def __iter__(self):
        while True:
            i = self.next_index
            self.next_index += 2
            self.read.append(i)
            gen = torch.Generator().manual_seed(i)
            yield {"x": torch.randn(6, generator=gen), "labels": torch.tensor(i % 3)}

    def state_dict(self) -> dict[str, int]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_index = state["next_index"]


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.fc(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class KillAtStep(TrainerCallback):
    def __init__(self) -> None:
        step, _, rank = os.environ.get("KILL_JOB_AT_STEP", "").partition(":")
        self.step = int(step) if step and int(rank) == RANK else None

    def on_train_begin(self, args, state, control, **kwargs):
        say(f"RANK{RANK} BEGIN_STEP {state.global_step}")

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main(out: Path) -> None:
    logging.basicConfig(level=logging.INFO, format=f"RANK{RANK} %(message)s")
    logging.getLogger("trainwell").setLevel(logging.INFO)
    set_seed(0)
    args = TrainingArguments(output_dir=str(out), use_cpu=True, per_device_train_batch_size=3, max_steps=8,
                             learning_rate=0.1, save_strategy="steps", save_steps=3, seed=0, report_to="none",
                             disable_tqdm=True, remove_unused_columns=False)
    stream = RankStream()
    trainer = Trainer(model=Classifier(), args=args, train_dataset=stream, callbacks=[KillAtStep()])
    trainer.train(resume_from_checkpoint=True if get_last_checkpoint(str(out)) else None)
    say(f"RANK{RANK} FIRST_READ {stream.read[0]}")
    if RANK == 0:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in trainer.model.state_dict().items()},
                  str(out / "final.safetensors"))
    sys.stdout.flush()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
