"""Under torchrun, ``TrainingArguments.main_process_first()`` used before any Trainer makes the
other ranks wait for the main process, as upstream's (its ``_setup_devices``, reached through ``args.device``, builds
accelerate's ``PartialState``: the process group exists from the arguments' first runtime use).

The file is both the test and the job (``python test_main_process_first.py OUT`` under torchrun, gloo): no Trainer is
built; rank 0 sleeps inside the block, then writes a marker file; rank 1 records whether the marker exists when it
enters the block (it must: it waited at the barrier). Each rank writes what it saw to ``rank-<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT_S = 240
SLEEP_S = 2.0


def job(out: Path) -> None:
    import torch.distributed as dist

    from trainwell import TrainingArguments

    rank = int(os.environ["RANK"])
    seen: dict[str, Any] = {"group_before": dist.is_initialized()}
    args = TrainingArguments(str(out / "run"), use_cpu=True, report_to="none")
    seen["group_after_args"] = dist.is_initialized()  # constructing the arguments touches nothing
    for local in (True, False):
        marker = out / f"marker-{local}"
        with args.main_process_first(local=local, desc="tokenising"):
            seen[f"group_in_block_{local}"] = dist.is_initialized()
            if rank == 0:
                time.sleep(SLEEP_S)
                marker.write_text(str(time.time()))
            else:
                seen[f"marker_seen_{local}"] = marker.is_file()
    seen["world_size"], seen["process_index"] = args.world_size, args.process_index
    (out / f"rank-{rank}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from helpers.launch import run, torchrun  # here: the job (this file) runs without tests/ on sys.path

    out = tmp_path_factory.mktemp("main_process_first")
    run(torchrun(Path(__file__).resolve(), out), "the 2-rank main_process_first job", timeout=TIMEOUT_S)
    return [json.loads((out / f"rank-{rank}.json").read_text()) for rank in (0, 1)]


def test_replicas_wait_for_the_main_process_before_any_trainer(seen) -> None:
    assert seen[1]["marker_seen_True"] is True and seen[1]["marker_seen_False"] is True


def test_the_group_is_made_at_the_first_runtime_use(seen) -> None:
    for rank, rank_seen in enumerate(seen):
        assert rank_seen["group_before"] is False and rank_seen["group_after_args"] is False
        assert rank_seen["group_in_block_True"] is True and rank_seen["group_in_block_False"] is True
        assert (rank_seen["world_size"], rank_seen["process_index"]) == (2, rank)


if __name__ == "__main__":
    job(Path(sys.argv[1]))
