"""checkpoint_store on fsspec's ``memory://``: atomic publish without rename, background upload with retries,
fresh-machine resume (exact), rotation and the best checkpoint on the store, the store's lock, credentials kept out.

The S3 server tests (moto) and the kill / two-rank tests are in ``test_object_store_s3.py``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.checkpoint import store_upload
from trainwell.checkpoint.layout import CheckpointError, list_complete_checkpoints, write_marker
from trainwell.checkpoint.lock import OutputDirLockedError
from trainwell.checkpoint.store import DELETING, LOCK_OBJECT, UPLOADING, CheckpointStore, StoreLockLostError
from trainwell.checkpoint.digest import hash_file, default_algorithm


@pytest.fixture
def url():
    """A fresh ``memory://`` root, emptied afterwards (the memory file system lives as long as the process)."""
    import fsspec

    root = f"memory://tw-{uuid.uuid4().hex[:8]}/run"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 1)

    def forward(self, x, labels):
        pred = self.b(self.drop(torch.relu(self.a(x)))).squeeze(-1)
        return {"loss": ((pred - labels) ** 2).mean()}


def _data(n: int = 40) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(6, generator=gen), "labels": torch.randn((), generator=gen)} for _ in range(n)]


class StopAt(TrainerCallback):
    """Stops the run after step ``step`` (its checkpoint saved): a run interrupted there."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _train(out: Path, *, store: str | None = None, resume=None, stop: int | None = None, **extra) -> Trainer:
    options = dict(per_device_train_batch_size=4, max_steps=8, save_steps=2, learning_rate=0.05,
                   report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1)
    options.update(extra)
    args = TrainingArguments(output_dir=str(out), checkpoint_store=store, **options)
    torch.manual_seed(1)
    trainer = Trainer(model=Net(), args=args, train_dataset=_data(),
                      eval_dataset=_data(12) if args.eval_strategy != "no" else None,
                      callbacks=[StopAt(stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _store_names(url: str) -> list[str]:
    return [name for name, _ in CheckpointStore(url).complete()]


def _local_checkpoint(folder: Path, files: dict[str, bytes]) -> Path:
    folder.mkdir(parents=True)
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    algorithm = default_algorithm()
    write_marker(folder, {rel: {"size": len(data), algorithm: hash_file(folder / rel).digest}
                          for rel, data in files.items()}, run="r1")
    return folder


FILES = {"model.safetensors": b"w" * 1000, "optimizer.pt": b"o" * 500, "shards/rank1.distcp": b"s" * 300}


def test_publish_is_complete_only_with_marker_and_sizes(tmp_path, url):
    store = CheckpointStore(url)
    store.upload(_local_checkpoint(tmp_path / "checkpoint-2", FILES), run="r1")
    assert _store_names(url) == ["checkpoint-2"]
    assert not store.fs.exists(f"{store.root}/checkpoint-2/.uploading")
    store.fs.pipe_file(f"{store.root}/checkpoint-2/optimizer.pt", b"o" * 499)  # an object of another size
    assert _store_names(url) == []
    store.upload(tmp_path / "checkpoint-2", run="r1")  # published again: complete
    store.fs.rm_file(f"{store.root}/checkpoint-2/.complete")
    assert _store_names(url) == []


def test_interrupted_upload_leaves_nothing_a_resume_takes(tmp_path, url, monkeypatch):
    store = CheckpointStore(url)
    local = _local_checkpoint(tmp_path / "checkpoint-4", FILES)
    real, calls = store.fs.put_file, []

    def lost_connection(src, dst, **kwargs):
        calls.append(dst)
        if len(calls) == 2:
            raise ConnectionError("connection reset by peer")
        return real(src, dst, **kwargs)

    monkeypatch.setattr(store.fs, "put_file", lost_connection)
    with pytest.raises(ConnectionError):
        store.upload(local, run="r1")
    monkeypatch.undo()
    assert store.fs.exists(f"{store.root}/checkpoint-4/model.safetensors")  # an object did arrive...
    assert store.complete() == []  # ...but no checkpoint is visible
    assert store.unfinished() == ["checkpoint-4"]
    assert store.remove_unfinished() == ["checkpoint-4"] and not store.fs.exists(f"{store.root}/checkpoint-4")


def test_download_verifies_checksums(tmp_path, url):
    store = CheckpointStore(url)
    store.upload(_local_checkpoint(tmp_path / "a" / "checkpoint-2", FILES), run="r1")
    store.fs.pipe_file(f"{store.root}/checkpoint-2/model.safetensors", b"x" * 1000)  # same size, other bytes
    assert _store_names(url) == []  # same size, but not the object the marker recorded (its fingerprint)
    with pytest.raises(CheckpointError, match="checksum"):
        store.download("checkpoint-2", tmp_path / "b")
    assert not (tmp_path / "b" / "checkpoint-2").exists() and list((tmp_path / "b").iterdir()) == []


def test_fresh_machine_resume_is_exact_and_rotation_holds_on_the_store(tmp_path, url):
    reference = _train(tmp_path / "ref")
    _train(tmp_path / "first", store=url, stop=4, save_total_limit=2)
    assert _store_names(url) == ["checkpoint-2", "checkpoint-4"]
    resumed = _train(tmp_path / "fresh", store=url, resume=True, save_total_limit=2)
    assert resumed.state.global_step == 8
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    assert _store_names(url) == ["checkpoint-6", "checkpoint-8"]  # the older ones rotated away on the store too
    assert [p.name for p in list_complete_checkpoints(tmp_path / "fresh")] == ["checkpoint-6", "checkpoint-8"]
    stats = resumed._tw_checkpoints.store.stats
    assert stats.uploaded == 2 and stats.bytes > 0


def test_auto_on_an_empty_store_starts_fresh(tmp_path, url):
    trainer = _train(tmp_path / "out", store=url, resume="auto", max_steps=2)
    assert trainer.state.global_step == 2 and _store_names(url) == ["checkpoint-2"]


def test_best_model_is_downloaded_and_loaded_at_the_end(tmp_path, url):
    best = dict(eval_strategy="steps", eval_steps=2, load_best_model_at_end=True, metric_for_best_model="loss",
                greater_is_better=False, save_total_limit=1)  # the lowest eval loss is an older checkpoint
    reference = _train(tmp_path / "ref", **best)
    assert Path(reference.state.best_model_checkpoint).name != "checkpoint-8"
    _train(tmp_path / "first", store=url, stop=6, **best)
    resumed = _train(tmp_path / "fresh", store=url, resume=True, **best)
    assert Path(resumed.state.best_model_checkpoint) == tmp_path / "fresh" / Path(
        reference.state.best_model_checkpoint).name
    for name, value in reference.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_failed_upload_is_retried_then_raised_naming_the_checkpoint(tmp_path, url, monkeypatch):
    monkeypatch.setattr(store_upload, "BACKOFF_S", 0.0)
    attempts = []

    def refused(self, folder, **kwargs):
        attempts.append(folder.name)
        raise PermissionError("AccessDenied")

    monkeypatch.setattr(CheckpointStore, "upload", refused)
    with pytest.raises(CheckpointError, match=r"uploading checkpoint-2 to checkpoint_store .* failed after 4"):
        _train(tmp_path / "out", store=url, max_steps=2)
    assert attempts == ["checkpoint-2"] * 4


def test_an_upload_that_hangs_fails_by_name_at_the_deadline(tmp_path, url, monkeypatch):
    """A store that stops answering (a request that never returns, which no retry sees) ends the run with an error
    naming the checkpoint once the deadline passes, instead of train() waiting forever for the last upload."""
    import threading
    import time

    monkeypatch.setattr(store_upload, "DEADLINE_S", 0.5)
    monkeypatch.setattr(store_upload, "MIN_RATE", 1e9)  # the checkpoint's few kB add nothing
    released = threading.Event()
    calls = []

    def hangs(self, folder, **kwargs):
        calls.append(folder.name)
        released.wait(30)
        raise ConnectionError("the store went away")

    monkeypatch.setattr(CheckpointStore, "upload", hangs)
    start = time.monotonic()
    try:
        with pytest.raises(CheckpointError, match=r"uploading checkpoint-2 to checkpoint_store .* has not finished "
                                                  r"within its deadline of 0.5 s"):
            _train(tmp_path / "out", store=url, max_steps=2)
    finally:
        released.set()
    assert time.monotonic() - start < 20
    assert calls == ["checkpoint-2"]  # not retried past the deadline
    assert [p.name for p in list_complete_checkpoints(tmp_path / "out")] == ["checkpoint-2"]  # kept locally


def test_store_lock_refuses_a_second_live_run(tmp_path, url):
    store = CheckpointStore(url)
    store.fs.pipe_file(f"{store.root}/{LOCK_OBJECT}", json.dumps(
        {"owner": "other", "pid": 1, "host": "elsewhere", "heartbeat": __import__("time").time()}).encode())
    with pytest.raises(OutputDirLockedError, match="in use by another run"):
        _train(tmp_path / "out", store=url, max_steps=2)
    store.fs.pipe_file(f"{store.root}/{LOCK_OBJECT}", json.dumps(
        {"owner": "other", "pid": 1, "host": "elsewhere", "heartbeat": 0}).encode())  # stale: taken over
    _train(tmp_path / "out2", store=url, max_steps=2)
    assert not store.fs.exists(f"{store.root}/{LOCK_OBJECT}")  # released at the end


def test_a_dead_processs_store_lock_on_this_host_is_taken_over_with_a_warning(tmp_path, url, monkeypatch, caplog):
    """A lock left on the store by a process of this host that is gone is taken over, with the warning the
    ``output_dir`` lock gives (before: silently)."""
    import socket

    from trainwell.checkpoint import layout

    store = CheckpointStore(url)
    store.fs.pipe_file(f"{store.root}/{LOCK_OBJECT}", json.dumps(
        {"owner": "gone", "pid": 4242, "host": socket.gethostname(), "heartbeat": __import__("time").time()}).encode())
    monkeypatch.setattr(layout, "pid_alive", lambda pid: pid != 4242)
    with caplog.at_level("WARNING", logger="trainwell"):
        store.acquire_lock("mine")
    warned = [r.getMessage() for r in caplog.records if "taking over the lock" in r.getMessage()]
    assert warned == [f"taking over the lock {url}/{LOCK_OBJECT} left by pid 4242 on host {socket.gethostname()}, "
                      "which is no longer running"], warned


def test_resume_true_with_nothing_anywhere_names_the_store_too(tmp_path, url):
    """``resume_from_checkpoint=True`` with an empty ``output_dir`` and an empty store: the error names both (before:
    only the folder, as if the store had not been looked at)."""
    with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory \(.*\) nor in "
                                         rf"checkpoint_store {url} \(resume_from_checkpoint=True\)"):
        _train(tmp_path / "out", store=url, max_steps=2, resume=True)


def test_storage_options_never_written(tmp_path, url, caplog):
    secret = "SEKRIT-" + uuid.uuid4().hex
    caplog.set_level("DEBUG")
    args = dict(per_device_train_batch_size=4, max_steps=2, save_steps=2, report_to="none", use_cpu=True,
                disable_tqdm=True)
    trainer = Trainer(model=Net(), train_dataset=_data(), args=TrainingArguments(
        output_dir=str(tmp_path / "out"), checkpoint_store=url, storage_options={"token": secret}, **args))
    trainer.train()
    trainer.save_model()
    assert trainer.args.storage_options == {"token": secret}  # the arguments in use keep it
    assert secret not in trainer.args.to_json_string() and secret not in caplog.text
    store = CheckpointStore(url)
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    for key in store.fs.find(store.root):
        assert secret.encode() not in store.fs.cat_file(key), key


def test_a_slow_upload_keeps_its_checkpoint_from_the_local_rotation(tmp_path, url, monkeypatch):
    """save_total_limit=1 rotates the local staging folder at every save; a checkpoint still being uploaded is deleted
    only after its upload (before the fix the rotation removed checkpoint-2 under the upload, which then failed)."""
    import time

    real = CheckpointStore.upload

    def slow(self, folder, **kwargs):
        time.sleep(0.3)  # the next save (and its local rotation) happens meanwhile
        return real(self, folder, **kwargs)

    monkeypatch.setattr(CheckpointStore, "upload", slow)
    monkeypatch.setattr(store_upload, "RETRIES", 0)
    trainer = _train(tmp_path / "out", store=url, max_steps=6, save_total_limit=1)
    assert trainer._tw_checkpoints.store.stats.uploaded == 3
    assert _store_names(url) == ["checkpoint-6"]
    assert [p.name for p in list_complete_checkpoints(tmp_path / "out")] == ["checkpoint-6"]


def test_async_save_publishes_to_the_store(tmp_path, url):
    trainer = _train(tmp_path / "out", store=url, max_steps=4, async_save=True)
    assert _store_names(url) == ["checkpoint-2", "checkpoint-4"]
    assert trainer._tw_checkpoints.store.stats.uploaded == 2
    local = CheckpointStore(url).read_marker("checkpoint-4")
    assert local == json.loads((tmp_path / "out" / "checkpoint-4" / ".complete").read_text())


def test_command_line_last_defers_to_the_store(tmp_path, url):
    """``--resume_from_checkpoint last`` on an empty output_dir is refused without a store, and left to the Trainer
    (which downloads the store's newest) with one."""
    from types import SimpleNamespace

    from trainwell.cli.main import CLIError, _resume_value

    empty = str(tmp_path / "empty")
    with pytest.raises(CLIError, match="holds no checkpoint"):
        _resume_value(SimpleNamespace(resume_from_checkpoint="last", output_dir=empty))
    assert _resume_value(SimpleNamespace(resume_from_checkpoint="last", output_dir=empty, checkpoint_store=url)) is True


def test_without_fsspec_the_error_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "fsspec", None)  # what `import fsspec` sees when it is not installed
    with pytest.raises(ImportError, match=r"checkpoint_store='s3://bucket/run' needs fsspec: pip install "
                                          r"'trainwell\[store\]' and the file system of the URL \(s3fs"):
        CheckpointStore("s3://bucket/run")


def test_a_run_whose_lock_was_taken_over_replaces_and_deletes_nothing(tmp_path, url):
    mine, other = CheckpointStore(url), CheckpointStore(url)
    mine.acquire_lock("mine")
    mine.upload(_local_checkpoint(tmp_path / "a" / "checkpoint-2", FILES), run="r1")
    other.heartbeat("other")  # forced over the live lock
    other.owner = "other"
    other.upload(_local_checkpoint(tmp_path / "b" / "checkpoint-4", FILES), run="r2")
    with pytest.raises(StoreLockLostError, match="taken over by another run"):
        mine.upload(_local_checkpoint(tmp_path / "a" / "checkpoint-4", FILES), run="r1")
    for act in (lambda: mine.rotate(1, keep=set(), current_run="r1"), lambda: mine.delete("checkpoint-4"),
                mine.keep_alive):
        with pytest.raises(StoreLockLostError):
            act()
    assert _store_names(url) == ["checkpoint-2", "checkpoint-4"]
    assert mine.read_marker("checkpoint-4") == json.loads((tmp_path / "b" / "checkpoint-4" / ".complete").read_text())
    mine.release_lock("mine")  # not its lock any more: kept
    assert json.loads(mine.fs.cat_file(f"{mine.root}/{LOCK_OBJECT}"))["owner"] == "other"


def test_a_live_upload_is_never_removed_nor_replaced(tmp_path, url, monkeypatch):
    import time

    from trainwell.checkpoint import store as store_module

    store = CheckpointStore(url)
    store.acquire_lock("mine")
    live = {"run": "r2", "owner": "other", "host": "another-host", "pid": 1, "heartbeat": time.time()}
    store.fs.pipe_file(f"{store.root}/checkpoint-4/{UPLOADING}", json.dumps(live).encode())
    store.fs.pipe_file(f"{store.root}/checkpoint-4/model.safetensors", b"u" * 10)
    assert store.unfinished() == ["checkpoint-4"] and store.remove_unfinished() == []
    with pytest.raises(CheckpointError, match="being uploaded by another live run"):
        store.upload(_local_checkpoint(tmp_path / "checkpoint-4", FILES), run="r1")
    assert store.fs.exists(f"{store.root}/checkpoint-4/model.safetensors")
    monkeypatch.setattr(store_module, "STALE_S", 0.0)  # its heartbeat is old now: a dead run's upload
    time.sleep(0.01)
    assert store.remove_unfinished() == ["checkpoint-4"] and store._sizes("checkpoint-4") == {}


def test_an_interrupted_deletion_is_finished_by_the_next_rotation(tmp_path, url):
    store = CheckpointStore(url)
    store.acquire_lock("mine")
    for step in (2, 4, 6):
        store.upload(_local_checkpoint(tmp_path / f"checkpoint-{step}", FILES), run="r1")
    store.fs.pipe_file(f"{store.root}/checkpoint-2/{DELETING}", b"{}")  # killed after .deleting, marker kept
    assert _store_names(url) == ["checkpoint-4", "checkpoint-6"]  # a deletion began: not complete any more
    store.fs.pipe_file(f"{store.root}/checkpoint-4/{DELETING}", b"{}")  # killed after the marker's deletion
    store.fs.rm_file(f"{store.root}/checkpoint-4/.complete")
    assert store.rotate(5, keep=set(), current_run="r1") == []
    assert store._sizes("checkpoint-2") == {} and store._sizes("checkpoint-4") == {}
    assert _store_names(url) == ["checkpoint-6"]


def test_the_lease_beats_while_an_upload_runs_and_stops_the_run_once_taken_over(tmp_path, url, monkeypatch):
    import threading
    import time

    from trainwell.checkpoint import store as store_module
    from trainwell.checkpoint.store_upload import StoreUploader

    monkeypatch.setattr(store_module, "HEARTBEAT_S", 0.05)
    store = CheckpointStore(url)
    store.acquire_lock("mine")
    reached, released, real = threading.Event(), threading.Event(), store._check_sizes

    def held(name, files):  # every object up, no marker yet: the upload lasts until released
        result = real(name, files)
        reached.set()
        released.wait(30)
        return result

    monkeypatch.setattr(store, "_check_sizes", held)
    uploader = StoreUploader(store, retries=0)
    uploader.submit(_local_checkpoint(tmp_path / "checkpoint-2", FILES), run="r1")
    try:
        assert reached.wait(30)
        first = store._read_lock()["heartbeat"]
        mark = json.loads(store.fs.cat_file(f"{store.root}/checkpoint-2/{UPLOADING}"))["heartbeat"]
        time.sleep(0.5)
        assert store._read_lock()["heartbeat"] > first  # refreshed during the upload
        assert json.loads(store.fs.cat_file(f"{store.root}/checkpoint-2/{UPLOADING}"))["heartbeat"] > mark
        CheckpointStore(url).heartbeat("other")  # taken over
        deadline = time.monotonic() + 10
        while store.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(StoreLockLostError):
            uploader.raise_if_failed()
    finally:
        released.set()
        uploader.close()
    assert _store_names(url) == [] and store.read_marker("checkpoint-2") is None  # no marker after the takeover


def test_uploads_and_the_resume_line_say_where_at_the_default_verbosity(tmp_path, url, caplog):
    """One warning-level line per finished upload (checkpoint and URL); one resume line, saying whether the
    checkpoint was downloaded from the store (and from where) or found on the local disk."""
    with caplog.at_level("WARNING", logger="trainwell"):
        _train(tmp_path / "first", store=url, stop=4)
    uploads = [r.getMessage() for r in caplog.records if "uploaded" in r.getMessage()]
    assert [line.split(" (")[0] for line in uploads] == [
        f"checkpoint_store: uploaded checkpoint-{step} to {url}/checkpoint-{step}" for step in (2, 4)]
    caplog.clear()
    with caplog.at_level("WARNING", logger="trainwell"):
        _train(tmp_path / "fresh", store=url, resume="auto", max_steps=6)
    resumed = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert len(resumed) == 1 and resumed[0].startswith(
        f"resume_from_checkpoint='auto': resuming from {tmp_path / 'fresh' / 'checkpoint-4'}, the newest"), resumed
    assert f"(downloaded from {url}/checkpoint-4; an older one is used if it is damaged)" in resumed[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="trainwell"):
        _train(tmp_path / "fresh", store=url, resume=True, max_steps=8)
    resumed = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert len(resumed) == 1 and resumed[0].startswith("resume_from_checkpoint=True: resuming from "
                                                       f"{tmp_path / 'fresh' / 'checkpoint-6'}, the newest"), resumed
    assert "(local; an older one is used if it is damaged)" in resumed[0]
