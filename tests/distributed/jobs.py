"""What the 2-rank jobs of this folder share: their classification rows, the arguments that pick a backend, and
their end (rank 0 writes the results, then every rank leaves together).

Imported by the jobs (torchrun runs them as scripts, with this folder first on ``sys.path``), the test files that
are their own job included; the tests read the file back with ``helpers.launch.run_json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["backend_args", "finish", "make_data", "say"]


def say(line: str) -> None:
    """Write ``line`` to stdout in one ``write`` call, so two ranks sharing the pipe never interleave within a line
    (``print`` writes the text and its newline separately when stdout is unbuffered, as under ``PYTHONUNBUFFERED``)."""
    os.write(1, (line + "\n").encode())


def make_data(n: int = 48) -> list[dict[str, torch.Tensor]]:
    """``n`` rows ``{"x": (6,), "labels": class in 0..2}`` drawn from a generator seeded with 3."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(n, 6, generator=gen)
    y = torch.randint(0, 3, (n,), generator=gen)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def backend_args(name: str) -> dict:
    """The ``TrainingArguments`` that select backend ``name`` (``ddp``, ``fsdp``, ``zero2``, ``zero3``) on gloo."""
    if name == "fsdp":
        return {"fsdp": "full_shard"}
    if name in ("zero2", "zero3"):
        return {"deepspeed": {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                              "steps_per_print": 10 ** 9, "zero_optimization": {"stage": int(name[-1])}},
                "ddp_backend": "gloo"}
    return {}


def finish(path: Path, results: Any) -> None:
    """Rank 0 (or the only process) writes ``results`` as JSON to ``path``; then, under a process group, every rank
    waits for the others and closes the group (a rank that exits while gloo threads still run can abort)."""
    if int(os.environ.get("RANK", "0")) == 0:
        path.write_text(json.dumps(results))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
