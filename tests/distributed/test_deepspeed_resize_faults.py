"""Faults around the resize of a DeepSpeed checkpoint (``backends/deepspeed/universal.py``).

* A process killed during the conversion (SIGKILL right after ``ds_to_universal`` wrote its folder, before the
  load) left ``output_dir/.tmp-universal-*`` for good (fp32 weights and both Adam moments: tens of GB for a large
  model); the relaunch must remove it and resume exactly.
* One disk per node (``save_on_each_node=True``; simulated by two launchers on localhost, each in its own working
  folder with the relative ``output_dir="out"``): rank 0 converted into its ``out``, node 1 looked for that path in
  its own ``out`` and the job hung (still waiting after 400 s). Now the path is absolute and every rank checks it
  sees the conversion before any collective (a node that does not converts its own copy), and the resume is exact.
* A node's copy missing other nodes' optimizer partitions is refused on every rank, naming the layout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, free_port, run, start, torchrun, wait
from helpers.tensors import final_weights

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.deepspeed]
pytest.importorskip("deepspeed")

HERE = Path(__file__).parent
ELASTIC_JOB = HERE / "elastic_job.py"
PER_NODE_JOB = HERE / "per_node_resize_job.py"
TIMEOUT_S = 400
FLOAT_NOISE = 1e-6  # as test_elastic_resume.py


def _env(**extra: str) -> dict[str, str]:
    return child_env(DS_ACCELERATOR="cpu", **extra)


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ZeRO-2 on one process, 12 steps, checkpoints 6 and 12: ``ROOT/zero2/a1`` (the ground truth of a resize)."""
    root = tmp_path_factory.mktemp("resize_faults")
    run(torchrun(ELASTIC_JOB, root, "zero2", "a1", nproc=1), "zero2 a1 (1 process)", timeout=TIMEOUT_S, env=_env())
    return root


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=FLOAT_NOISE, msg=name)


def test_a_kill_during_the_conversion_leaves_nothing_after_the_relaunch(one_process_run):
    root = one_process_run
    out = root / "zero2" / "r12"
    killed = run(torchrun(ELASTIC_JOB, root, "zero2", "r12=zero2/a1/checkpoint-6", nproc=2),
                 "resume on 2 processes, rank 0 killed after converting", timeout=TIMEOUT_S, check=False,
                 env=_env(TRAINWELL_TEST_KILL_AT="universal:6:0"))
    assert killed.returncode != 0
    left = [p.name for p in out.glob(".tmp-universal-*")]
    assert left, f"the kill came before the conversion folder existed:\n{killed.stdout[-3000:]}"
    assert not (out / "result.json").exists()

    again = run(torchrun(ELASTIC_JOB, root, "zero2", "r12=zero2/a1/checkpoint-6", nproc=2), "the relaunch",
                timeout=TIMEOUT_S, env=_env())
    assert "Removed incomplete checkpoint folders" in again.stdout and left[0] in again.stdout  # it says so
    assert not [p.name for p in out.rglob(".tmp-*")]
    result = json.loads((out / "result.json").read_text())
    assert result == {"global_step": 12, "world_size": 2}
    _assert_close(final_weights(out), final_weights(root / "zero2" / "a1"))


def _two_launchers(root: Path) -> list[subprocess.CompletedProcess]:
    """Two torchrun launchers on localhost, one process each, as the two nodes of one job, each started in
    ``root/nodeN`` (where the relative output_dir ``out`` of the job lies)."""
    port = free_port()
    procs = [start([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                    "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(PER_NODE_JOB)],
                   env=_env(), cwd=root / f"node{node}") for node in (0, 1)]
    return [wait(p, f"node {i}", timeout=TIMEOUT_S, check=False) for i, p in enumerate(procs)]


def test_one_disk_per_node_resumes_exactly(one_process_run, tmp_path):
    source = one_process_run / "zero2" / "a1" / "checkpoint-6"
    outs = [tmp_path / f"node{node}" / "out" for node in (0, 1)]
    for out in outs:
        shutil.copytree(source, out / "checkpoint-6")
    done = _two_launchers(tmp_path)
    for node, proc in enumerate(done):
        assert proc.returncode == 0, f"node {node}:\n{proc.stdout[-4000:]}"
        assert json.loads((outs[node] / "result.json").read_text()) == {"global_step": 12, "world_size": 2}
    _assert_close(final_weights(outs[0]), final_weights(one_process_run / "zero2" / "a1"))
    for out in outs:
        assert not [p.name for p in out.glob(".tmp-*")]
        assert (out / "checkpoint-12").is_dir()  # each node saved onto its own disk


def test_copies_missing_partitions_are_refused_on_every_rank():
    from trainwell.backends.deepspeed.universal import _refuse_partial_copies
    from trainwell.checkpoint.layout import CheckpointError

    with pytest.raises(CheckpointError, match=r"needs all 2 optimizer partitions.*rank\(s\) \[0, 1\].*"
                                              r"save_on_each_node=True.*resume on the 2 process"):
        _refuse_partial_copies(Path("out/checkpoint-6"), [(0, [0]), (1, [1])], saved_world=1)
    _refuse_partial_copies(Path("out/checkpoint-6"), [(0, [0, 1]), (0, [0, 1]), (1, [0, 1])], saved_world=2)
