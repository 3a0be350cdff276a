"""DeepSpeed ZeRO 0-3 under ``torchrun --nproc_per_node=2`` (gloo, CPU): loss curves, offload, resume, weights out.

One launch of ``deepspeed_job.py`` runs every scenario (see there); each test checks its own part of the results.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, free_port, run, run_json, torchrun

pytest.importorskip("deepspeed")

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.deepspeed]

JOB = Path(__file__).with_name("deepspeed_job.py")
TOL = dict(rel=1e-4, abs=1e-5)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("deepspeed")
    out = work / "results.json"
    return run_json(torchrun(JOB, out, work), out, "the 2-rank DeepSpeed job", timeout=600,
                    env=child_env(DS_ACCELERATOR="cpu"))


def _ok(results: dict, name: str) -> dict:
    part = results[name]
    assert "error" not in part, part.get("error")
    return part


@pytest.mark.parametrize("name", ["zero0", "zero1", "zero2", "zero2_offload"])
def test_zero_stages_match_ddp(results, name):
    ddp, run = _ok(results, "ddp"), _ok(results, name)
    assert len(ddp["curve"]) == 6
    assert run["curve"] == pytest.approx(ddp["curve"], **TOL)
    assert ddp["curve"][-1] < ddp["curve"][0]  # it did learn
    if name != "zero0":  # stage 0 (plain data parallel in DeepSpeed) does not record the global norm
        assert run["grad_norms"] == pytest.approx(ddp["grad_norms"], rel=1e-3)  # DeepSpeed's own norm, logged
    for key, values in ddp["weights"].items():
        assert run["weights"][key] == pytest.approx(values, rel=1e-4, abs=1e-5), key


def test_zero3_trains_sharded_and_matches_ddp(results):
    ddp, z3 = _ok(results, "ddp"), _ok(results, "zero3")
    assert z3["curve"] == pytest.approx(ddp["curve"], **TOL)
    assert all(shape == [0] for shape in z3["sharded_shapes"])  # parameters really are partitioned
    for key, values in ddp["weights"].items():
        assert z3["weights"][key] == pytest.approx(values, rel=1e-4, abs=1e-5), key


def test_zero3_model_init_builds_partitioned_and_matches_ddp(results):
    ddp, z3 = _ok(results, "ddp"), _ok(results, "zero3_model_init")
    assert z3["partitioned_at_init"]  # built under deepspeed.zero.Init, never whole on one rank
    assert z3["curve"] == pytest.approx(ddp["curve"], **TOL)


@pytest.mark.parametrize("name", ["resume", "resume_zero3"])
def test_resume_continues_the_same_curve(results, name):
    part = _ok(results, name)
    assert part["resumed"] == pytest.approx(part["full"], **TOL)
    for key, values in part["full_weights"].items():
        assert part["resumed_weights"][key] == pytest.approx(values, rel=1e-5, abs=1e-6), key
    for name in ("latest", "global_step3", "zero_to_fp32.py", "model.safetensors", "trainer_state.json"):
        assert name in part["files"], name


def test_zero_to_fp32_loads_into_the_plain_model(results, tmp_path):
    from trainwell.backends.deepspeed import get_fp32_state_dict_from_zero_checkpoint
    from trainwell.cli.commands.deepspeed_tools import cmd_zero_to_fp32

    sys.path.insert(0, str(JOB.parent))
    from deepspeed_job import MLP

    z3 = _ok(results, "zero3")
    target = tmp_path / "fp32.safetensors"
    assert cmd_zero_to_fp32([z3["checkpoint"], str(target)]) == 0
    from safetensors.torch import load_file

    state = load_file(str(target))
    model = MLP()
    model.load_state_dict(state, strict=True)
    for key, values in z3["weights"].items():
        assert state[key].dtype == torch.float32
        assert state[key].flatten().tolist() == pytest.approx(values, rel=1e-6, abs=1e-7), key
    again = get_fp32_state_dict_from_zero_checkpoint(z3["checkpoint"])
    assert torch.equal(again["fc1.weight"], state["fc1.weight"])


def test_zero3_predict_matches_single_process(results):
    z3 = _ok(results, "zero3")
    assert len(z3["predictions"]) == 10
    assert z3["predictions"] == pytest.approx(z3["expected"], rel=1e-5, abs=1e-6)


def test_notebook_emulation_single_process(tmp_path):
    """The seeds' one-process launch (env vars, no launcher): ZeRO-2 and ZeRO-3 give the plain run's curve."""
    proc = run([sys.executable, JOB.with_name("deepspeed_notebook_job.py"), tmp_path], "the notebook emulation",
               timeout=600, env=child_env(MASTER_PORT=str(free_port())), merge=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("CURVES ")]
    assert lines, f"no CURVES line:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    curves = json.loads(lines[0].removeprefix("CURVES "))
    assert curves["zero2"]["backend"] == curves["zero3"]["backend"] == "DeepSpeedBackend"
    assert len(curves["plain"]["curve"]) == 4
    for name in ("zero2", "zero3"):
        assert curves[name]["curve"] == pytest.approx(curves["plain"]["curve"], **TOL)
