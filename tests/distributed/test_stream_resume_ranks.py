"""Two ranks, each reading its own share of a stream that keeps its position: rank 1 is SIGKILLed after a
checkpoint, the relaunch resumes each rank's stream from its own saved position (no example read again) and ends
with the weights of the uninterrupted run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, start, torchrun, wait
from helpers.tensors import final_weights

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = Path(__file__).with_name("stream_kill_job.py")
TIMEOUT_S = 120


def _launch(out: Path, kill: str | None = None):
    env = child_env(drop=["KILL_JOB_AT_STEP"])
    if kill:
        env["KILL_JOB_AT_STEP"] = kill
    return start(torchrun(JOB, out), env=env, merge=False)


def test_each_rank_resumes_its_stream_from_its_saved_position(tmp_path):
    from trainwell.checkpoint.layout import marker_files
    from trainwell.checkpoint.rng import read_rng_file

    reference = _launch(tmp_path / "reference")
    out = tmp_path / "killed"
    killed = wait(_launch(out, "4:1"), "the launch killed at step 4", timeout=TIMEOUT_S, check=False)
    assert killed.returncode != 0 and "(exitcode: -9) local_rank: 1" in killed.stdout + killed.stderr
    folder = out / "checkpoint-3"
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(marker_files(folder))
    for rank in (0, 1):  # 3 steps of 3 examples consumed on each rank (rank r reads r, r + 2, ...)
        saved = read_rng_file(folder / f"rng_state_{rank}.pth")["trainwell_stream"]
        assert saved == {"state": {"next_index": rank + 2 * 9}, "world_size": 2}
    final = wait(_launch(out), "the relaunch", timeout=TIMEOUT_S)
    log = final.stdout + final.stderr
    assert dict(re.findall(r"RANK(\d) BEGIN_STEP (\d+)", log)) == {"0": "3", "1": "3"}, log[-4000:]
    # (rank 1 logs warnings only: log_level_replica) each rank read on from its own position
    assert "RANK0 resuming the stream from its saved position" in log and "re-reading" not in log, log[-4000:]
    assert dict(re.findall(r"RANK(\d) FIRST_READ (\d+)", log)) == {"0": "18", "1": "19"}, log[-4000:]
    wait(reference, "the uninterrupted run", timeout=TIMEOUT_S)
    want, got = final_weights(tmp_path / "reference"), final_weights(out)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
