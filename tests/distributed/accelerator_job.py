"""``trainer.accelerator`` on 2 ranks (gloo, CPU): the same calls on trainwell's and, when installed, upstream's.

Usage: ``python -m torch.distributed.run --nproc_per_node=2 accelerator_job.py OUT_DIR``. Rank 0 writes
``OUT_DIR/result.json`` with one entry per library.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
from torch import nn

torch.set_num_threads(1)
warnings.simplefilter("ignore")

import trainwell  # noqa: E402


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        return {"logits": self.lin(x)}


def probe(lib: object, out: str) -> dict[str, object]:
    args = lib.TrainingArguments(output_dir=out, use_cpu=True, report_to="none", disable_tqdm=True)
    acc = lib.Trainer(model=Model(), args=args).accelerator
    rank = acc.process_index
    same = torch.arange(4.0).reshape(2, 2) + 10 * rank
    result = {
        "num_processes": acc.num_processes, "process_index": rank, "is_main": acc.is_main_process,
        "distributed_type": str(getattr(acc.distributed_type, "value", acc.distributed_type)),
        "gather": acc.gather(same).tolist(),
        "gather_for_metrics": acc.gather_for_metrics(same).tolist(),
        "gather_objects": acc.gather_for_metrics([f"r{rank}a", f"r{rank}b"]),
        "reduce_sum": acc.reduce(same, reduction="sum").tolist(),
        "reduce_mean": acc.reduce(same, reduction="mean").tolist(),
        "pad": acc.pad_across_processes(torch.ones(1 + rank, 2) * (rank + 1), dim=0, pad_index=-1).tolist(),
    }
    if lib is trainwell:  # uneven first dimensions: trainwell pads before gathering (accelerate would fail)
        result["gather_uneven"] = acc.gather(torch.full((1 + rank,), float(rank))).tolist()
    acc.wait_for_everyone()
    return result


def main() -> None:
    out = sys.argv[1]
    results = {"trainwell": probe(trainwell, os.path.join(out, "a"))}
    try:
        import transformers
    except ImportError:
        transformers = None
    if transformers is not None:
        results["transformers"] = probe(transformers, os.path.join(out, "b"))
    if int(os.environ.get("RANK", "0")) == 0:
        with open(os.path.join(out, "result.json"), "w") as fh:
            json.dump(results, fh)


if __name__ == "__main__":
    main()
