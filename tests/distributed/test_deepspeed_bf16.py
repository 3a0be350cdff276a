"""DeepSpeed + bf16 with float inputs under ``torchrun --nproc_per_node=2`` (gloo, CPU): inputs are cast as upstream.

Upstream's ``_prepare_input`` casts floating-point inputs (not integer ones) to the engine's dtype when DeepSpeed is
enabled; without it ``--deepspeed ds.json --bf16`` fails at the first forward ("mat1 and mat2 must have the same
dtype").
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

pytestmark = pytest.mark.distributed

JOB = Path(__file__).with_name("deepspeed_bf16_job.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_bf16_engine_gets_bf16_float_inputs_and_long_integer_inputs(tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(JOB), str(out), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and out.is_file(), f"job failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert "error" not in result, result["error"]
    assert result["param_dtype"] == "torch.bfloat16"  # the engine really runs the model in bf16
    assert result["seen"] == ["torch.bfloat16/torch.int64"]  # floats cast, integers untouched, in train and eval
    assert len(result["losses"]) == 2 and all(math.isfinite(v) for v in result["losses"])
    assert math.isfinite(result["eval_loss"])
