"""Smoke test of ``bench/stream_resume.py --quick``: both sides resume from checkpoints at steps 10 and 40 of a
sleeping stream; trainwell restores the stream's position (it reads only the first step's batch and the one fetched
ahead), upstream re-reads every consumed example (no timing is asserted: the numbers depend on the machine)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers")


@pytest.mark.slow
def test_stream_resume_benchmark_quick_reports_both_sides(tmp_path):
    out = tmp_path / "stream_resume.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "stream_resume.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| position (steps) |" in done.stdout
    result = json.loads(out.read_text())
    assert result["config"]["positions"] == [10, 40] and result["config"]["batch"] == 4
    rows = {(r["side"], r["position"]): r for r in result["rows"]}
    assert set(rows) == {(side, p) for side in ("trainwell", "upstream") for p in (10, 40)}
    for position in (10, 40):
        mine, theirs = rows["trainwell", position], rows["upstream", position]
        assert mine["how"] == "restored" and mine["examples_read"] == 2 * 4  # the step's batch and the next
        assert theirs["how"] == "re-read" and theirs["examples_read"] >= position * 4
        assert mine["seconds_to_first_step"] > 0 and theirs["seconds_to_first_step"] > 0
