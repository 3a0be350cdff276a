"""Two nodes simulated by two launchers on localhost (``torchrun --nnodes=2 --nproc_per_node=1 --node_rank=K``).

Each layout trains the kill job (DDP, dropout: an exact resume needs every rank's RNG), has node 1 killed at step 4
(the checkpoint of step 3 is the newest), relaunches both nodes, and must end with the weights of an uninterrupted
2-process run:

- one shared ``output_dir`` with ``save_on_each_node`` False or True: written once, by rank 0;
- one ``output_dir`` per node with ``save_on_each_node=True``: every node holds complete, verifiable checkpoints
  (the shared files and its own ranks' RNG states);
- one ``output_dir`` per node with ``save_on_each_node=False``, or with FSDP (DCP indexes every rank's shard on
  rank 0 only): refused at the first save, naming the setting.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, free_port, start, torchrun, wait

JOB = Path(__file__).with_name("kill_job.py")
TIMEOUT_S = 300


def _two_nodes(outs: list[Path], *, each_node: bool, kill: str | None = None,
               backend: str = "ddp") -> list[subprocess.CompletedProcess]:
    port = free_port()
    env = child_env(drop=["KILL_JOB_AT_STEP", "TRAINWELL_TEST_KILL_AT"],
                    KILL_JOB_SAVE_ON_EACH_NODE="1" if each_node else "0")
    if kill:
        env["KILL_JOB_AT_STEP"] = kill
    procs = [start([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
                    f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}", str(JOB),
                    str(outs[node]), backend], env=env, merge=False) for node in (0, 1)]
    return [wait(proc, f"node {node}", timeout=TIMEOUT_S, check=False) for node, proc in enumerate(procs)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out = tmp_path_factory.mktemp("reference")
    proc = wait(start(torchrun(JOB, out, "ddp"), env=child_env(), merge=False), "the uninterrupted run",
                timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(str(out / "final.safetensors"))


def _listed(folder: Path) -> set[str]:
    from trainwell.checkpoint.layout import marker_files

    return set(marker_files(folder))


def _check(outs: list[Path], *, per_node: bool) -> None:
    from trainwell.checkpoint.layout import list_complete_checkpoints, list_foreign_checkpoints
    from trainwell.checkpoint.manager import CheckpointManager

    for node, out in enumerate(outs):
        found = list_complete_checkpoints(out)
        assert found and not list_foreign_checkpoints(out), sorted(p.name for p in out.iterdir())
        assert not [p.name for p in out.iterdir() if p.name.startswith((".tmp-", ".trainwell-node-probe"))]
        for folder in found:
            listed = _listed(folder)
            assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= listed
            rng = {name for name in listed if re.match(r"rng_state_\d\.pth", name)}
            assert rng == ({f"rng_state_{node}.pth"} if per_node else {"rng_state_0.pth", "rng_state_1.pth"})
            CheckpointManager(out).verify(folder)  # sizes and checksums


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("per_node,each_node", [(False, False), (False, True), (True, True)],
                         ids=["shared", "shared-save_on_each_node", "disk-per-node"])
def test_node_killed_and_relaunched_ends_as_the_uninterrupted_run(tmp_path, reference, per_node, each_node):
    from safetensors.torch import load_file

    outs = [tmp_path / "node0", tmp_path / "node1"] if per_node else [tmp_path / "shared"] * 2
    killed = _two_nodes(outs, each_node=each_node, kill="4:1")
    assert all(proc.returncode != 0 for proc in killed)
    assert "(exitcode: -9)" in killed[1].stdout + killed[1].stderr, killed[1].stderr[-3000:]
    _check(outs, per_node=per_node)
    assert [p.name for p in outs[1].glob("checkpoint-*")] == ["checkpoint-3"]
    final = _two_nodes(outs, each_node=each_node)
    for proc in final:
        assert proc.returncode == 0, proc.stderr[-4000:]
    log = final[0].stdout + final[1].stdout
    assert "RANK0 BEGIN_STEP 3" in log and "RANK1 BEGIN_STEP 3" in log  # both nodes resumed from checkpoint-3
    _check(outs, per_node=per_node)
    got = load_file(str(outs[0] / "final.safetensors"))
    assert sorted(got) == sorted(reference)
    for name, tensor in reference.items():
        assert torch.equal(got[name], tensor), name


@pytest.mark.slow
@pytest.mark.distributed
def test_disk_per_node_without_save_on_each_node_is_refused_at_the_first_save(tmp_path):
    outs = [tmp_path / "node0", tmp_path / "node1"]
    procs = _two_nodes(outs, each_node=False)
    for proc in procs:
        assert proc.returncode != 0
        assert "is not shared between the nodes" in proc.stderr and "set save_on_each_node=True" in proc.stderr, \
            proc.stderr[-3000:]
    for out in outs:  # nothing half-written, no probe left
        assert not [p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".tmp-", ".trainwell"))] \
            if out.is_dir() else True


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp_on_a_disk_per_node_is_refused_at_the_first_save(tmp_path):
    """DCP writes every rank's shard into one folder and its metadata on rank 0's node only: no node would hold a
    complete checkpoint, so one disk per node is refused even with save_on_each_node=True."""
    outs = [tmp_path / "node0", tmp_path / "node1"]
    procs = _two_nodes(outs, each_node=True, backend="fsdp")
    for proc in procs:
        assert proc.returncode != 0
        assert "on one disk per node, but this backend's sharded state" in proc.stderr, proc.stderr[-3000:]
    for out in outs:
        assert not list(out.glob("checkpoint-*"))
