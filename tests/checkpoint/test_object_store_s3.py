"""checkpoint_store against a real S3 server (moto's, started on localhost by the test) through s3fs: a SIGKILL in
the middle of an upload leaves no checkpoint a resume takes, and a fresh machine resumes to the uninterrupted run's
weights; credentials given as ``storage_options`` never reach a file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, free_port
from trainwell.checkpoint.store import CheckpointStore

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

JOB = textwrap.dedent('''
    import json, sys
    import torch
    from torch import nn
    from trainwell import Trainer, TrainerCallback, TrainingArguments
    from trainwell.trainer_utils import get_last_checkpoint

    out, url, options, max_steps, resume = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}  # {"stop": step, "save_steps": n}
    # the requeue idioms: get_last_checkpoint(output_dir), True, "auto", a checkpoint's path; False: a fresh run
    value = {"none": None, "false": False, "true": True}.get(resume, resume)
    if resume == "last":
        value = get_last_checkpoint(out)
    elif resume.startswith("path:"):
        value = out + "/" + resume[len("path:"):]

    class StopAt(TrainerCallback):  # a run interrupted after this step (its checkpoint saved)
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == extra.get("stop"):
                control.should_training_stop = True

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.drop, self.b = nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 1)

        def forward(self, x, labels):
            pred = self.b(self.drop(torch.relu(self.a(x)))).squeeze(-1)
            return {"loss": ((pred - labels) ** 2).mean()}

    gen = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(6, generator=gen), "labels": torch.randn((), generator=gen)} for _ in range(40)]
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=max_steps,
                             save_steps=extra.get("save_steps", 2),
                             learning_rate=0.05, report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1,
                             checkpoint_store=url or None, storage_options=options or None)
    torch.manual_seed(1)
    trainer = Trainer(model=Net(), args=args, train_dataset=data, callbacks=[StopAt()])
    trainer.train(resume_from_checkpoint=value)
    torch.save(trainer.model.state_dict(), out + "/final.pt")
''')


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on localhost and a fresh bucket; yields the storage options that reach it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    options = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
               "key": "testing", "secret": "testing-" + uuid.uuid4().hex}
    import boto3

    boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key=options["secret"]).create_bucket(Bucket="tw-bucket")
    yield options
    server.stop()


def _job(tmp_path: Path, out: Path, url: str, options: dict, max_steps: int, resume: str, **env: str):
    import json

    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.run([sys.executable, str(script), str(out), url, json.dumps(options), str(max_steps), resume],
                          env=child_env(drop=["TRAINWELL_TEST_KILL_AT"], **env), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_kill_during_upload_then_fresh_machine_resume_is_exact(tmp_path, s3, monkeypatch):
    url = f"s3://tw-bucket/{uuid.uuid4().hex[:8]}"
    (tmp_path / "ref").mkdir()
    monkeypatch.setattr(sys, "argv", ["job", str(tmp_path / "ref"), "", "{}", "4", "none"])
    exec(compile(JOB, "job.py", "exec"), {"__name__": "reference"})  # the uninterrupted run, in this process
    # every object of checkpoint-4 uploaded but its marker: the process is SIGKILLed there
    killed = _job(tmp_path, tmp_path / "a", url, s3, 4, "none", TRAINWELL_TEST_KILL_AT="published:4:0")
    assert killed.returncode == -9, killed.stderr[-3000:]
    store = CheckpointStore(url, s3)
    assert [name for name, _ in store.complete()] == ["checkpoint-2"]
    assert store.unfinished() == ["checkpoint-4"]
    assert store.fs.exists(f"{store.root}/checkpoint-4/model.safetensors")
    # a fresh machine (empty output_dir), the command line's "auto": checkpoint-2 from the store, then on to step 4
    resumed = _job(tmp_path, tmp_path / "b", url, s3, 4, "auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "checkpoint-2" in resumed.stderr and "resuming" in resumed.stderr.lower()
    want, got = torch.load(tmp_path / "ref" / "final.pt"), torch.load(tmp_path / "b" / "final.pt")
    for name, value in want.items():
        assert torch.equal(value, got[name]), name
    assert [name for name, _ in store.complete()] == ["checkpoint-2", "checkpoint-4"]
    assert store.unfinished() == []  # the interrupted upload was removed, then published again
    secret = s3["secret"].encode()
    for root in (tmp_path / "a", tmp_path / "b"):
        for path in root.rglob("*"):
            assert not path.is_file() or secret not in path.read_bytes(), path
    assert secret not in (resumed.stdout + resumed.stderr).encode()
    for key in store.fs.find(store.root):
        assert secret not in store.fs.cat_file(key), key


def _here(monkeypatch, out: Path, url: str, options: dict, max_steps: int, resume: str, **extra) -> dict:
    """JOB in this process (a second or so, where a subprocess takes ten); returns its names (``trainer``...)."""
    import json

    monkeypatch.setattr(sys, "argv", ["job", str(out), url, json.dumps(options), str(max_steps), resume,
                                      json.dumps(extra)])
    scope = {"__name__": "job"}
    exec(compile(JOB, "job.py", "exec"), scope)
    return scope


def _same_weights(a, b) -> None:
    want, got = a.model.state_dict(), b.model.state_dict()
    for name, value in want.items():
        assert torch.equal(value, got[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("idiom", ["last", "true", "auto", "path:checkpoint-4"])
def test_requeue_on_a_fresh_machine_resumes_from_the_store(tmp_path, s3, monkeypatch, caplog, idiom):
    """Every requeue idiom (``get_last_checkpoint(output_dir)``, which gives None on the fresh machine's empty folder,
    ``True``, ``"auto"``, the path ``output_dir/checkpoint-4`` that only the store holds) resumes from the store's
    newest checkpoint and ends on the uninterrupted run's weights; before, None trained from step 0 (its rotation
    deleting the store's checkpoints) and the path was refused."""
    caplog.set_level("INFO", logger="trainwell")
    url = f"s3://tw-bucket/{uuid.uuid4().hex[:8]}"
    reference = _here(monkeypatch, tmp_path / "ref", "", {}, 6, "none")["trainer"]
    _here(monkeypatch, tmp_path / "a", url, s3, 6, "none", stop=4)  # machine a: interrupted after checkpoint-4
    store = CheckpointStore(url, s3)
    assert [name for name, _ in store.complete()] == ["checkpoint-2", "checkpoint-4"]
    caplog.clear()
    job = _here(monkeypatch, tmp_path / "b", url, s3, 6, idiom)  # machine b: nothing on its disk
    if idiom == "last":
        assert job["value"] is None
        assert "holds no checkpoint and checkpoint_store" in caplog.text
    trainer = job["trainer"]
    assert trainer._tw_checkpoints.resumed_from == tmp_path / "b" / "checkpoint-4"
    assert f"Resuming training from {tmp_path / 'b' / 'checkpoint-4'}" in caplog.text
    assert trainer.state.global_step == 6
    _same_weights(reference, trainer)
    assert [name for name, _ in store.complete()] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


@pytest.mark.slow
def test_a_fresh_run_on_another_runs_prefix_warns_and_keeps_them(tmp_path, s3, monkeypatch, caplog):
    """``resume_from_checkpoint=False`` on a prefix holding another run's checkpoints trains as in a used output_dir:
    one warning naming them; they are still on the store afterwards (before: no word)."""
    url = f"s3://tw-bucket/{uuid.uuid4().hex[:8]}"
    _here(monkeypatch, tmp_path / "a", url, s3, 6, "none", save_steps=3)
    caplog.clear()
    trainer = _here(monkeypatch, tmp_path / "b", url, s3, 4, "false")["trainer"]
    assert trainer._tw_checkpoints.resumed_from is None and trainer.state.global_step == 4
    warned = [r.getMessage() for r in caplog.records if "holds an earlier run's checkpoints" in r.getMessage()]
    assert len(warned) == 1 and "checkpoint-3, checkpoint-6" in warned[0] and "supersedes" in warned[0]
    assert url in warned[0]
    names = [name for name, _ in CheckpointStore(url, s3).complete()]
    assert names == ["checkpoint-3", "checkpoint-6", "checkpoint-2", "checkpoint-4"]  # the other run's, first


@pytest.mark.slow
def test_a_store_left_behind_gets_the_resumed_checkpoint(tmp_path, s3, monkeypatch, caplog):
    """The store holds checkpoint-2, output_dir checkpoint-4 (its upload lost in an outage): the requeued run resumes
    the local checkpoint-4, says so, and publishes it at the start (before: the store stayed behind, and the log named
    the store's checkpoint-2)."""
    caplog.set_level("INFO", logger="trainwell")
    url = f"s3://tw-bucket/{uuid.uuid4().hex[:8]}"
    reference = _here(monkeypatch, tmp_path / "ref", "", {}, 6, "none")["trainer"]
    _here(monkeypatch, tmp_path / "a", url, s3, 6, "none", stop=4)
    store = CheckpointStore(url, s3)
    store.delete("checkpoint-4")  # the outage: its upload never happened
    assert [name for name, _ in store.complete()] == ["checkpoint-2"]
    caplog.clear()
    trainer = _here(monkeypatch, tmp_path / "a", url, s3, 6, "true")["trainer"]
    local = tmp_path / "a" / "checkpoint-4"
    assert trainer._tw_checkpoints.resumed_from == local
    assert f"Resuming training from {local}" in caplog.text
    assert "resuming from {}, the newest".format(local) in caplog.text
    assert "lacks checkpoint-4, the checkpoint this run resumes from" in caplog.text
    assert "checkpoint-2 (the store's newest) is in" not in caplog.text  # nothing downloaded
    assert store.read_marker("checkpoint-4") == json.loads((local / ".complete").read_text())
    assert [name for name, _ in store.complete()] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    _same_weights(reference, trainer)
