"""Smoke test of ``bench/save_cost.py --quick``: both sides run (40 steps, a checkpoint every 10), and the report
has its fields: train_runtime, CPU, time per checkpoint, fsync count (no timing is asserted: the numbers depend on
the machine; the counts do not)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers")

SIDE_FIELDS = {"train_runtime", "cpu_seconds", "seconds_per_checkpoint", "first_checkpoint_seconds", "fsync_calls",
               "fsync_seconds", "saves", "fsync_per_checkpoint", "deepspeed_imported"}


@pytest.mark.slow
def test_save_cost_benchmark_quick_reports_both_sides(tmp_path):
    out = tmp_path / "save_cost.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "save_cost.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ratio trainwell / upstream, seconds_per_checkpoint" in done.stdout
    result = json.loads(out.read_text())
    assert result["config"]["steps"] == 40 and result["config"]["save_steps"] == 10
    assert result["config"]["rounds"] == 1 and result["fsync_counter"] in ("strace", "os.fsync")
    assert [row["side"] for row in result["rows"]] == ["upstream", "trainwell"]
    for side in ("upstream", "trainwell"):
        summary = result["sides"][side]
        assert set(summary) == SIDE_FIELDS, side
        assert summary["saves"] == 4 and summary["train_runtime"] > 0 and summary["cpu_seconds"] > 0
        assert 0 < summary["seconds_per_checkpoint"] and summary["first_checkpoint_seconds"] > 0
    trainwell, upstream = result["sides"]["trainwell"], result["sides"]["upstream"]
    # every file once, the marker, the checkpoint's folder and output_dir: 13 for a transformers model's 10 files
    assert trainwell["fsync_per_checkpoint"] == 13 and upstream["fsync_calls"] == 0
    assert trainwell["deepspeed_imported"] is False  # a plain save keeps DeepSpeed out
    assert set(result["ratios"]) == {"train_runtime", "cpu_seconds", "seconds_per_checkpoint"}
    assert not list((tmp_path / "work").glob("*-out"))  # the runs' output_dirs are removed
