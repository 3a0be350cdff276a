"""``bench/gpu_check.py --cpu-smoke`` runs on the CPU: exit status 0, one JSON row per check, the CUDA-only ones
reported as skipped, and the fp32 row really compared trainwell's numbers with ``transformers.Trainer``'s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RUN_ON_CPU = {"fp32_bit_identical", "resume_dropout", "gradient_checkpointing", "ddp_clip_norm", "fsdp_dcp_resume"}
NEED_CUDA = {"bf16_losses", "fp16_scaler", "torch_compile", "tf32", "fsdp_fp16_accumulation_async_save",
             "fsdp_offload"}


@pytest.mark.slow
def test_gpu_check_cpu_smoke(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "r.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--cpu-smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["name"]: row for row in report["rows"]}
    assert set(rows) == RUN_ON_CPU | NEED_CUDA and len(report["rows"]) == len(rows)
    assert {name for name, row in rows.items() if row["status"] == "pass"} == RUN_ON_CPU
    assert all(rows[name]["status"] == "skipped (needs CUDA)" for name in NEED_CUDA)
    assert report["failed"] == 0 and report["device"] == "cpu"
    fp32 = rows["fp32_bit_identical"]["numbers"]
    assert len(fp32["losses_trainwell"]) == 6 and fp32["losses_trainwell"] == fp32["losses_transformers"]
    assert fp32["grad_norms_trainwell"] == fp32["grad_norms_transformers"] and len(fp32["grad_norms_trainwell"]) == 6
    assert fp32["weights_compared"] > 10 and fp32["max_weight_diff"] == 0.0
    assert rows["resume_dropout"]["numbers"]["steps_after_resume"] == 4
    assert rows["ddp_clip_norm"]["numbers"]["backend"] == "DDPBackend"
    assert "pass" in proc.stdout and "fp32_bit_identical" in proc.stdout  # the printed table
