"""``trainer.accelerator`` under torchrun (2 ranks, gloo): trainwell's answers equal upstream's accelerate ones."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("accelerator")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(HERE / "accelerator_job.py"), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return json.loads((out / "result.json").read_text())


def test_collectives_on_two_ranks(result):
    ours = result["trainwell"]
    assert (ours["num_processes"], ours["process_index"], ours["is_main"]) == (2, 0, True)
    assert ours["distributed_type"] == "MULTI_CPU"
    assert ours["gather"] == [[0.0, 1.0], [2.0, 3.0], [10.0, 11.0], [12.0, 13.0]]
    assert ours["gather_for_metrics"] == ours["gather"]  # no padding duplicates to drop
    assert ours["gather_objects"] == ["r0a", "r0b", "r1a", "r1b"]
    assert ours["reduce_sum"] == [[10.0, 12.0], [14.0, 16.0]]
    assert ours["reduce_mean"] == [[5.0, 6.0], [7.0, 8.0]]
    assert ours["pad"] == [[1.0, 1.0], [-1.0, -1.0]]
    assert ours["gather_uneven"] == [0.0, 1.0, 1.0]


def test_same_answers_as_upstream_accelerate(result):
    if "transformers" not in result:
        pytest.skip("transformers is not installed")
    ours = {k: v for k, v in result["trainwell"].items() if k != "gather_uneven"}
    assert ours == result["transformers"]
