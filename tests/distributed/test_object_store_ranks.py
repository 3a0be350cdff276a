"""checkpoint_store with 2 gloo ranks: FSDP2's sharded state (every rank's DCP shard reaches the store, listed in
the marker, each object checked), and two nodes with one disk each (two launchers, DDP, ``save_on_each_node``: each
node uploads its own files, node 0 writes the marker listing both nodes' once both reported). In both, a fresh
machine with another number of processes (1) resumes from the store alone to the uninterrupted 2-rank run's weights
(float noise: the reductions' order differs)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

import sys

from helpers.launch import child_env, free_port, run, start, torchrun, wait
from helpers.tensors import final_weights
from trainwell.checkpoint.store import CheckpointStore

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
JOB = Path(__file__).with_name("store_job.py")
FLOAT_NOISE = 1e-6  # as test_elastic_resume.py


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on localhost with the bucket ``ranks``; yields its storage options."""
    pytest.importorskip("s3fs")
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket="ranks")
    yield {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}, "key": "testing",
           "secret": "testing"}
    server.stop()


def _resume_on_one_process(tmp_path: Path, url: str, options: dict, backend: str, want: Path) -> None:
    """A fresh 1-process job resumes the store's newest (checkpoint-6) and ends on ``want``'s final weights."""
    done = run(torchrun(JOB, tmp_path / "r1", url, json.dumps(options), "true", backend, nproc=1), "1 rank, fresh",
               timeout=400, env=child_env())
    log = done.stdout + (done.stderr or "")
    assert "checkpoint-6 (the store's newest) is in" in log and "resuming from" in log, log[-3000:]  # downloaded, then resumed
    for phrase in ("start fresh", "starts fresh", "not restored", "exact data position cannot"):
        assert phrase not in log, f"{phrase!r}\n{log[-3000:]}"
    assert json.loads((tmp_path / "r1" / "result.json").read_text()) == {"global_step": 12, "world_size": 1}
    got, expected = final_weights(tmp_path / "r1"), final_weights(want)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=FLOAT_NOISE, msg=name)


def test_sharded_checkpoints_on_the_store_resume_on_another_number_of_processes(tmp_path, s3):
    url = f"s3://ranks/{uuid.uuid4().hex[:8]}"
    run(torchrun(JOB, tmp_path / "a2", url, json.dumps(s3), "none", nproc=2), "2 ranks", timeout=400,
        env=child_env())
    store = CheckpointStore(url, s3)
    assert [name for name, _ in store.complete()] == ["checkpoint-6", "checkpoint-12"]
    files = store.read_marker("checkpoint-6")["files"]
    shards = sorted(name for name in files if name.startswith("fsdp_state/") and name.endswith(".distcp"))
    assert len(shards) == 2, sorted(files)  # each rank's shard
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(files)
    store.delete("checkpoint-12")  # the run "stopped" after checkpoint-6
    _resume_on_one_process(tmp_path, url, s3, "fsdp", tmp_path / "a2")
    assert [name for name, _ in store.complete()] == ["checkpoint-6", "checkpoint-12"]


def test_one_disk_per_node_each_node_uploads_its_files(tmp_path, s3):
    url = f"s3://ranks/{uuid.uuid4().hex[:8]}"
    port = free_port()
    for node in (0, 1):
        (tmp_path / f"node{node}").mkdir()
    procs = [start([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
                    "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", str(JOB), "out", url,
                    json.dumps(s3), "none", "nodes"], env=child_env(), cwd=tmp_path / f"node{node}")
             for node in (0, 1)]
    done = [wait(p, f"node {i}", timeout=400, check=False) for i, p in enumerate(procs)]
    for node, proc in enumerate(done):
        assert proc.returncode == 0, f"node {node}:\n{proc.stdout[-4000:]}"
    locals_ = [json.loads((tmp_path / f"node{n}" / "out" / "checkpoint-6" / ".complete").read_text())["files"]
               for n in (0, 1)]
    assert "rng_state_1.pth" not in locals_[0] and "rng_state_0.pth" not in locals_[1]  # one disk per node
    store = CheckpointStore(url, s3)
    assert [name for name, _ in store.complete()] == ["checkpoint-6", "checkpoint-12"]
    files = store.read_marker("checkpoint-6")["files"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(files)
    assert not [key for key in store.fs.find(store.root) if key.endswith((".uploading", ".json"))
                and "/.node-" in key or key.endswith("/.uploading")]
    store.delete("checkpoint-12")
    _resume_on_one_process(tmp_path, url, s3, "nodes", tmp_path / "node0" / "out")
