"""checkpoint_store with 2 gloo ranks and FSDP2's sharded state: every rank's DCP shard reaches the store (listed in
the marker, each object checked), and a fresh machine with another number of processes (1) resumes from the store
alone to the uninterrupted 2-rank run's weights (float noise: the reductions' order differs)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, free_port, run, torchrun
from helpers.tensors import final_weights
from trainwell.checkpoint.store import CheckpointStore

pytestmark = [pytest.mark.distributed, pytest.mark.slow]
JOB = Path(__file__).with_name("store_job.py")
FLOAT_NOISE = 1e-6  # as test_elastic_resume.py


def test_sharded_checkpoints_on_the_store_resume_on_another_number_of_processes(tmp_path):
    pytest.importorskip("s3fs")
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        options = {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}, "key": "testing",
                   "secret": "testing"}
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket="ranks")
        url = f"s3://ranks/{uuid.uuid4().hex[:8]}"
        run(torchrun(JOB, tmp_path / "a2", url, json.dumps(options), "none", nproc=2), "2 ranks", timeout=400,
            env=child_env())
        store = CheckpointStore(url, options)
        assert [name for name, _ in store.complete()] == ["checkpoint-6", "checkpoint-12"]
        files = store.read_marker("checkpoint-6")["files"]
        shards = sorted(name for name in files if name.startswith("fsdp_state/") and name.endswith(".distcp"))
        assert len(shards) == 2, sorted(files)  # each rank's shard
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(files)
        store.delete("checkpoint-12")  # the run "stopped" after checkpoint-6
        done = run(torchrun(JOB, tmp_path / "r1", url, json.dumps(options), "true", nproc=1), "1 rank, fresh",
                   timeout=400, env=child_env())
        log = done.stdout + (done.stderr or "")
        assert "checkpoint-6 is in" in log and "resuming from" in log, log[-3000:]  # downloaded, then resumed
        for phrase in ("start fresh", "starts fresh", "not restored", "exact data position cannot"):
            assert phrase not in log, f"{phrase!r}\n{log[-3000:]}"
        assert json.loads((tmp_path / "r1" / "result.json").read_text()) == {"global_step": 12, "world_size": 1}
        got, want = final_weights(tmp_path / "r1"), final_weights(tmp_path / "a2")
        assert sorted(got) == sorted(want)
        for name, tensor in want.items():
            torch.testing.assert_close(got[name], tensor, rtol=0, atol=FLOAT_NOISE, msg=name)
        assert [name for name, _ in store.complete()] == ["checkpoint-6", "checkpoint-12"]
    finally:
        server.stop()
