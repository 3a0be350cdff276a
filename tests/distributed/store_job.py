"""The job of ``test_object_store_ranks.py``: FSDP2 (sharded state) with ``checkpoint_store``, or a resume from it.

Usage: ``store_job.py OUT URL OPTIONS_JSON RESUME [BACKEND]`` under ``torchrun --nproc_per_node=N`` (N = 1 or 2): trains into
the local ``OUT`` (the staging folder) with the checkpoints published to ``URL`` (``storage_options`` from
``OPTIONS_JSON``), from scratch (``RESUME`` = ``none``) or with ``resume_from_checkpoint=True`` (``RESUME`` =
``true``: ``OUT`` is empty, the checkpoint comes from the store). The global batch is 8 whatever N (the model of
``elastic_job.py``, 12 steps, a save every 6). BACKEND ``fsdp`` (default: FSDP2, sharded state) or ``nodes`` (DDP
with ``save_on_each_node=True``: two launchers, each node with its own relative ``OUT``). Rank 0 writes
``OUT/final.safetensors`` and ``OUT/result.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from trainwell import Trainer, TrainingArguments, set_seed  # noqa: E402
from elastic_job import Net  # noqa: E402
from jobs import make_data  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


def main(out: Path, url: str, options: dict, resume: str, backend: str) -> None:
    set_seed(0)
    if backend == "fsdp":
        engine = dict(fsdp="full_shard", fsdp_config={"state_dict_type": "SHARDED_STATE_DICT"})
    else:
        engine = dict(save_on_each_node=True)
    args = TrainingArguments(
        output_dir=str(out), use_cpu=True, per_device_train_batch_size=4, gradient_accumulation_steps=max(1, 2 // WORLD),
        num_train_epochs=2, learning_rate=0.05, warmup_steps=2, logging_steps=1, save_strategy="steps", save_steps=6,
        seed=0, report_to="none", disable_tqdm=True, max_grad_norm=1.0, checkpoint_store=url, storage_options=options,
        **engine)
    trainer = Trainer(model=Net(), args=args, train_dataset=make_data())
    trainer.train(resume_from_checkpoint=True if resume == "true" else None)
    state = trainer.backend.full_state_dict() if trainer.backend.caps.sharded_state else trainer.model.state_dict()
    if RANK == 0:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(out / "final.safetensors"))
        (out / "result.json").write_text(json.dumps({"global_step": trainer.state.global_step, "world_size": WORLD}))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], (sys.argv[5:] or ["fsdp"])[0])
