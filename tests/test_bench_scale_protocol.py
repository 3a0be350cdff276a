"""Smoke test of ``bench/scale_protocol.py`` at 2 processes: the real commit and discovery functions run on gloo and
the counted collectives and bytes are those of the protocol (no timing is asserted)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_scale_protocol_runs_at_two_processes(tmp_path):
    out = tmp_path / "scale.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_protocol.py"), "--procs", "2",
                           "--checkpoints", "2", "--model-bytes", "4096", "--shard-bytes", "4096", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["procs"] == 2 and row["ranks_per_node"] == 2
    commit, discovery = row["commit"], row["discovery"]
    # commit: gather of rank 0's pid, barrier, gather of the reports, gather of the outcomes
    assert commit["collectives"] == 4 and len(commit["seconds_all"]) == 2
    # rank 0 reports six files (its five and its RNG file), rank 1 one: rank 0 sends more, all receive 2 x the most
    assert commit["bytes_sent_rank0"] > commit["bytes_sent_other_rank_mean"] > 0
    assert commit["bytes_received_per_rank"] >= 2 * commit["bytes_sent_rank0"]
    # rank 0 hashes the engine shards of every rank at the seal (trainwell's own files were hashed while written)
    assert commit["bytes_hashed_rank0"] == 2 * 4096
    # discovery: the candidates' names, then the verification's and the load's agreements
    assert discovery["collectives"] == 3 and discovery["bytes_received_per_rank"] > 0
    assert 0 < discovery["bytes_hashed_per_rank_max"] < 4096 * 3 + 16 * 1024 * 2  # a share, not every file
    checkpoints = sorted(p.name for p in (tmp_path / "work" / "out-2").iterdir())
    assert checkpoints == ["checkpoint-1", "checkpoint-2"]  # sealed and renamed, no temporary folder left
    assert all((tmp_path / "work" / "out-2" / c / ".complete").is_file() for c in checkpoints)
