"""The end the 2-rank jobs of this folder share: rank 0 writes the results, then every rank leaves together.

Imported by the jobs (torchrun runs them as scripts, with this folder first on ``sys.path``), the test files that
are their own job included; the tests read the file back with ``helpers.launch.run_json``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["finish"]


def finish(path: Path, results: Any) -> None:
    """Rank 0 (or the only process) writes ``results`` as JSON to ``path``; then, under a process group, every rank
    waits for the others and closes the group (a rank that exits while gloo threads still run can abort)."""
    if int(os.environ.get("RANK", "0")) == 0:
        path.write_text(json.dumps(results))
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
