"""DeepSpeed + bf16 with float inputs under ``torchrun --nproc_per_node=2`` (gloo, CPU): inputs are cast as upstream.

Upstream's ``_prepare_input`` casts floating-point inputs (not integer ones) to the engine's dtype when DeepSpeed is
enabled; without it ``--deepspeed ds.json --bf16`` fails at the first forward ("mat1 and mat2 must have the same
dtype").
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from helpers.launch import child_env, run_json, torchrun

pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.deepspeed]

JOB = Path(__file__).with_name("deepspeed_bf16_job.py")


def test_bf16_engine_gets_bf16_float_inputs_and_long_integer_inputs(tmp_path):
    out = tmp_path / "result.json"
    result = run_json(torchrun(JOB, out, tmp_path), out, "the 2-rank DeepSpeed bf16 job", timeout=600,
                      env=child_env(DS_ACCELERATOR="cpu"))
    assert "error" not in result, result["error"]
    assert result["param_dtype"] == "torch.bfloat16"  # the engine really runs the model in bf16
    assert result["seen"] == ["torch.bfloat16/torch.int64"]  # floats cast, integers untouched, in train and eval
    assert len(result["losses"]) == 2 and all(math.isfinite(v) for v in result["losses"])
    assert math.isfinite(result["eval_loss"])
