"""The job of ``test_deepspeed_resize_faults.py``'s two-launcher case: one disk per node, simulated on one host.

Usage: ``per_node_resize_job.py`` under two torchrun launchers (``--nnodes=2 --node_rank=N``, one process each),
each started in its own working folder. Both use the relative ``output_dir="out"``, so each node has its own
(one disk per node, as far as relative paths go), and resume ``out/checkpoint-6``, their node's copy of a ZeRO-2
checkpoint written by one process, with ``save_on_each_node=True``. The first process of each node writes
``result.json`` (and rank 0 ``final.safetensors``) into its ``out``, or ``error.txt`` when the resume is refused.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

torch.set_num_threads(1)

from trainwell import Trainer, TrainingArguments, set_seed  # noqa: E402
from elastic_job import Net  # noqa: E402
from jobs import backend_args, make_data  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
NODE = int(os.environ.get("GROUP_RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def main() -> None:
    out = Path("out")
    set_seed(0)
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=4, gradient_accumulation_steps=max(1, 2 // WORLD),
        num_train_epochs=2, learning_rate=0.05, warmup_steps=2, logging_steps=1, save_strategy="steps", save_steps=6,
        seed=0, report_to="none", disable_tqdm=True, max_grad_norm=1.0, save_on_each_node=True,
        **backend_args("zero2"))
    trainer = Trainer(model=Net(), args=args, train_dataset=make_data())
    try:
        trainer.train(resume_from_checkpoint=str(out / "checkpoint-6"))
    except (ValueError, RuntimeError) as err:
        (out / "error.txt").write_text(f"{type(err).__name__}: {err}")
        sys.stdout.flush()
        os._exit(3)
    if RANK == 0:
        from safetensors.torch import save_file

        state = {k: v.detach().cpu().contiguous() for k, v in trainer.model.state_dict().items()}
        save_file(state, str(out / "final.safetensors"))
    (out / "result.json").write_text(json.dumps({"global_step": trainer.state.global_step, "world_size": WORLD}))
    sys.stdout.flush()
    torch.distributed.barrier()
    os._exit(0)  # DeepSpeed's communication threads can abort the interpreter's teardown; everything is written.


if __name__ == "__main__":
    main()
