"""2-process gloo runs on the CPU (torchrun) compared with a 1-process run of the same global batch.

One torchrun launch runs every scenario of ``worker.py`` in sequence (process start-up dominates the cost), and a
plain process runs the reference scenarios at the same time; the tests then compare the JSON files they wrote and
the captured output of both ranks.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from helpers.launch import start, torchrun, wait

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
TIMEOUT_S = 300
DIST_SCENARIOS = ["eval", "ddp", "ddp_ga", "zero", "fsdp_full", "fsdp_grad_op", "fsdp_ga", "fsdp_hybrid_offload",
                  "resume_fsdp",
                  "resume_zero", "log_warning", "log_info"]
REF_SCENARIOS = ["eval", "ddp", "ddp_ga"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the 2-rank launch and the 1-process reference (concurrently); return their results and output."""
    dist_dir, ref_dir = tmp_path_factory.mktemp("two_ranks"), tmp_path_factory.mktemp("one_rank")
    dist_proc = start(torchrun(WORKER, dist_dir, *DIST_SCENARIOS, flags=["--tee=3"]))
    ref_proc = start([sys.executable, WORKER, ref_dir, *REF_SCENARIOS])
    ref_out = wait(ref_proc, "the 1-process reference run", timeout=TIMEOUT_S).stdout
    dist_out = wait(dist_proc, "the 2-rank torchrun launch", timeout=TIMEOUT_S).stdout
    load = lambda folder, names: {n: json.loads((folder / f"{n}.json").read_text()) for n in names}
    return {"dist": load(dist_dir, DIST_SCENARIOS), "ref": load(ref_dir, REF_SCENARIOS),
            "output": dist_out, "ref_output": ref_out}


def _assert_same_run(got: dict[str, Any], want: dict[str, Any], *, rtol: float, atol: float) -> None:
    assert len(got["losses"]) == len(want["losses"]) == 12
    np.testing.assert_allclose(got["losses"], want["losses"], rtol=rtol, atol=atol)
    assert sorted(got["weights"]) == sorted(want["weights"])
    for name, values in want["weights"].items():
        np.testing.assert_allclose(got["weights"][name], values, rtol=rtol, atol=atol, err_msg=name)


def _rank_lines(output: str, scenario: str, rank: int) -> list[str]:
    """The lines rank ``rank`` printed during ``scenario`` (torchrun --tee prefixes them with [default<rank>]:)."""
    prefix = re.compile(rf"^\[default{rank}\]:(.*)$")
    lines, inside = [], False
    for raw in output.splitlines():
        match = prefix.match(raw)
        if not match:
            continue
        text = match.group(1)
        if text.startswith("=== "):
            inside = text == f"=== {scenario} ==="
            continue
        if inside:
            lines.append(text)
    return lines


def test_ddp_matches_one_process_with_the_global_batch(runs: dict[str, Any]) -> None:
    _assert_same_run(runs["dist"]["ddp"], runs["ref"]["ddp"], rtol=1e-5, atol=1e-6)


def test_ddp_with_gradient_accumulation_matches(runs: dict[str, Any]) -> None:
    _assert_same_run(runs["dist"]["ddp_ga"], runs["ref"]["ddp_ga"], rtol=1e-5, atol=1e-6)


def test_zero_redundancy_optimizer_matches_ddp(runs: dict[str, Any]) -> None:
    _assert_same_run(runs["dist"]["zero"], runs["ref"]["ddp"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scenario, reference", [("fsdp_full", "ddp"), ("fsdp_grad_op", "ddp"),
                                                 ("fsdp_ga", "ddp_ga"), ("fsdp_hybrid_offload", "ddp")])
def test_fsdp_matches_ddp(runs: dict[str, Any], scenario: str, reference: str) -> None:
    """full_shard / shard_grad_op with auto_wrap (by class, by size), with accumulation + activation
    checkpointing, and hybrid_shard with CPU offload."""
    _assert_same_run(runs["dist"][scenario], runs["ref"][reference], rtol=1e-4, atol=1e-5)


def test_fsdp_auto_wrap_sharded_the_blocks(runs: dict[str, Any]) -> None:
    lines = _rank_lines(runs["output"], "fsdp_full", 0)
    assert any("FSDP: 2 unit(s) + root" in line for line in lines), lines[:20]


def test_evaluation_on_two_ranks_returns_the_one_rank_predictions(runs: dict[str, Any]) -> None:
    got, want = runs["dist"]["eval"], runs["ref"]["eval"]
    assert got["num_samples"] == want["num_samples"] == 13
    assert len(got["predictions"]) == 13
    np.testing.assert_array_equal(got["label_ids"], want["label_ids"])  # same samples, same order, no padding
    np.testing.assert_allclose(got["predictions"], want["predictions"], rtol=0, atol=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-6)


def test_evaluation_after_sharded_training_matches(runs: dict[str, Any]) -> None:
    got, want = runs["dist"]["fsdp_full"], runs["ref"]["ddp"]
    assert len(got["predictions"]) == 13
    np.testing.assert_allclose(got["predictions"], want["predictions"], rtol=1e-4, atol=1e-5)
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=1e-4)


@pytest.mark.parametrize("scenario", ["resume_fsdp", "resume_zero"])
def test_sharded_checkpoint_resume_continues_the_curve(runs: dict[str, Any], scenario: str) -> None:
    result = runs["dist"][scenario]
    full, resumed = result["full"], result["resumed"]
    assert resumed["global_step"] == full["global_step"] == 12
    _assert_same_run(resumed, full, rtol=1e-5, atol=1e-6)
    _assert_same_run(full, runs["ref"]["ddp"], rtol=1e-4, atol=1e-5)
    folder = Path(result["final_dir"]).parent / "full"
    if scenario == "resume_fsdp":
        assert (folder / "checkpoint-3" / "fsdp_state" / ".metadata").is_file()
        assert not (folder / "checkpoint-3" / "optimizer.pt").exists()  # the optimizer state is in fsdp_state
    else:
        assert (folder / "checkpoint-3" / "optimizer.pt").is_file()  # consolidated ZeRO state


def test_resume_falls_back_when_the_sharded_state_is_missing(runs: dict[str, Any]) -> None:
    fallback = runs["dist"]["resume_fsdp"]["fallback"]
    _assert_same_run(fallback, runs["dist"]["resume_fsdp"]["full"], rtol=1e-5, atol=1e-6)
    lines = _rank_lines(runs["output"], "resume_fsdp", 0)
    assert any("checkpoint-12 is damaged" in line and "fsdp_state" in line for line in lines)
    assert any("Resuming training from" in line and line.endswith("checkpoint-9") for line in lines)


@pytest.mark.parametrize("scenario", ["resume_fsdp", "resume_zero"])
def test_consolidated_model_loads_in_one_process(runs: dict[str, Any], scenario: str) -> None:
    from safetensors.torch import load_file

    sys.path.insert(0, str(HERE))
    try:
        from worker import TinyNet
    finally:
        sys.path.remove(str(HERE))
    result = runs["dist"][scenario]
    state = load_file(str(Path(result["final_dir"]) / "model.safetensors"))
    model = TinyNet()
    model.load_state_dict(state, strict=True)
    for name, tensor in model.state_dict().items():
        np.testing.assert_allclose(tensor.reshape(-1).numpy(), result["resumed"]["weights"][name], rtol=0, atol=0)
    assert model(torch.zeros(1, 4))["logits"].shape == (1,)


def test_replica_prints_no_info_lines(runs: dict[str, Any]) -> None:
    """--log_level warning --log_level_replica error: the main process warns, the replica stays silent."""
    main, replica = (_rank_lines(runs["output"], "log_warning", rank) for rank in (0, 1))
    assert any("PROBE-WARNING rank0" in line for line in main)
    assert not any("PROBE-INFO" in line for line in main)
    assert not any(line.startswith("INFO:trainwell") or "PROBE" in line for line in replica), replica


def test_log_level_info_reaches_the_main_process_only(runs: dict[str, Any]) -> None:
    main, replica = (_rank_lines(runs["output"], "log_info", rank) for rank in (0, 1))
    assert any("INFO:trainwell.probe:PROBE-INFO rank0" in line for line in main)
    assert not any("PROBE" in line for line in replica), replica


def test_replicas_log_no_trainwell_info_anywhere(runs: dict[str, Any]) -> None:
    """log_level_replica defaults to warning: no scenario makes rank 1 print trainwell info lines."""
    replica = [line for line in runs["output"].splitlines() if line.startswith("[default1]:")]
    assert replica, "the launch captured nothing from rank 1"
    assert not any("INFO:trainwell" in line for line in replica)
