"""One run per output_dir: the lock taken by train(), its error, stale locks, and that nothing of the holder is lost."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.checkpoint import lock as lock_module
from trainwell.checkpoint.layout import COMPLETE_MARKER
from trainwell.checkpoint.lock import LOCK_NAME, OutputDirLock, OutputDirLockedError
from trainwell.trainer_utils import get_last_checkpoint

from helpers import RegressionModel, regression_data
from helpers.launch import ROOT, dead_pid, run, torchrun

REPO = ROOT


def make_trainer(out: Path, callbacks: list | None = None, **overrides) -> Trainer:
    kwargs = dict(output_dir=str(out), per_device_train_batch_size=4, max_steps=4, save_steps=2, disable_tqdm=True,
                  report_to="none")
    kwargs.update(overrides)
    return Trainer(model=RegressionModel(), args=TrainingArguments(**kwargs), train_dataset=regression_data(16),
                   callbacks=callbacks)


# ------------------------------------------------------------------------------------------------ two processes
TRAIN_SCRIPT = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from helpers import RegressionModel, regression_data
    from trainwell import Trainer, TrainerCallback, TrainingArguments

    out, started = sys.argv[1], Path(sys.argv[2])

    class Slow(TrainerCallback):
        """Signals when step 3 is done, then waits (at most 5 minutes) for the test's go-ahead."""
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                started.write_text("started")
                go = started.with_name("go")
                deadline = time.monotonic() + float(sys.argv[4])
                while not go.exists() and time.monotonic() < deadline:
                    time.sleep(0.05)

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=int(sys.argv[5]), save_steps=2,
                             disable_tqdm=True, report_to="none", overwrite_output_dir=True)
    Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16), callbacks=[Slow()]).train()
    print("finished")
''')


def start_training(script: Path, out: Path, started: Path, wait: float, steps: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, str(script), str(out), str(started), str(REPO / "tests"), str(wait),
                             str(steps)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_second_trainer_on_the_same_output_dir_fails_at_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    out = tmp_path / "out"
    first = start_training(script, out, tmp_path / "first_started", wait=300, steps=16)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "first_started").exists():
            assert first.poll() is None, first.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first trainer did not start"
            time.sleep(0.05)
        record = json.loads((out / LOCK_NAME).read_text())
        assert record["pid"] == first.pid and record["host"] == socket.gethostname()
        second = start_training(script, out, tmp_path / "second_started", wait=0, steps=4)
        _, err = second.communicate(timeout=120)  # the first is paused after step 3 meanwhile
        assert first.poll() is None, "the first trainer should still be training"
    finally:
        (tmp_path / "go").write_text("go")
        stdout, first_err = first.communicate(timeout=300)
    assert second.returncode != 0 and not (tmp_path / "second_started").exists()
    assert "OutputDirLockedError" in err and f"pid {first.pid} on host {socket.gethostname()}" in err
    assert "(since " in err and "give this run another output_dir" in err
    assert "overwrite_output_dir does not change this" in err
    assert first.returncode == 0 and "finished" in stdout, first_err[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == [f"checkpoint-{s}" for s in sorted(range(2, 17, 2), key=str)], names  # the lock is gone too
    assert all((out / name / COMPLETE_MARKER).is_file() for name in names)
    assert json.loads((out / "checkpoint-16" / "trainer_state.json").read_text())["global_step"] == 16


# ------------------------------------------------------------------------------------------------ in one process
def test_a_second_trainer_in_the_same_process_fails_and_the_first_continues(tmp_path):
    out = tmp_path / "out"
    errors = []

    class StartAnother(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                try:
                    make_trainer(out, overwrite_output_dir=True).train()
                except OutputDirLockedError as err:
                    errors.append(str(err))

    trainer = make_trainer(out, [StartAnother()])
    trainer.train()
    assert len(errors) == 1 and f"pid {os.getpid()} on host" in errors[0] and str(out / LOCK_NAME) in errors[0]
    assert trainer.state.global_step == 4
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint-2", "checkpoint-4"]


def test_the_lock_is_released_when_train_raises(tmp_path):
    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        make_trainer(tmp_path, [Boom()]).train()
    assert not (tmp_path / LOCK_NAME).exists()
    make_trainer(tmp_path).train(resume_from_checkpoint=True)  # the next run takes it without complaint
    assert not (tmp_path / LOCK_NAME).exists()


def test_the_lock_file_is_never_in_a_checkpoint_and_does_not_confuse_discovery(tmp_path):
    seen = []

    class Look(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            seen.append((tmp_path / LOCK_NAME).is_file())

    make_trainer(tmp_path, [Look()]).train()
    assert seen == [True, True]  # held while the checkpoints were written
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    assert not list(tmp_path.rglob(f"*{LOCK_NAME}*"))


def test_an_output_dir_created_only_for_the_lock_is_removed(tmp_path):
    out = tmp_path / "never_written"
    make_trainer(out, save_strategy="no", logging_strategy="no").train()
    assert not out.exists()


# ------------------------------------------------------------------------------------------------ stale locks
@pytest.mark.slow
def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    pid = dead_pid()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": socket.gethostname(), "since": "earlier"}))
    trainer = make_trainer(tmp_path)
    trainer.train()
    assert f"taking over the lock {tmp_path / LOCK_NAME} left by pid {pid}" in caplog.text
    assert trainer.state.global_step == 4 and not (tmp_path / LOCK_NAME).exists()


def test_a_lock_of_another_host_is_respected(tmp_path):
    record = {"pid": os.getpid(), "host": "gpu-node-17", "since": "2026-01-01T00:00:00+00:00"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(record))
    with pytest.raises(OutputDirLockedError, match=r"pid \d+ on host gpu-node-17 \(since 2026-01-01.*delete .*"
                                                   r"\.trainwell\.lock and start again"):
        make_trainer(tmp_path).train()
    assert json.loads((tmp_path / LOCK_NAME).read_text()) == record  # not ours to remove
    assert not (tmp_path / "checkpoint-2").exists()
    (tmp_path / LOCK_NAME).unlink()  # the documented fix
    make_trainer(tmp_path).train()
    assert (tmp_path / "checkpoint-4").is_dir()


@pytest.mark.slow
def test_without_flock_a_live_pid_holds_and_a_dead_one_does_not(tmp_path, monkeypatch):
    monkeypatch.setattr(OutputDirLock, "_try_flock", lambda self, fd: None)  # a file system without flock
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "since": "x"}))
        with pytest.raises(OutputDirLockedError, match=f"pid {holder.pid}"):
            OutputDirLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    with OutputDirLock(tmp_path) as lock:
        assert lock.held and json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_NAME).exists()


def test_the_lock_module_stays_light():
    source = Path(lock_module.__file__).read_text()
    assert "import torch" not in source and "import numpy" not in source


# ------------------------------------------------------------------------------------------------ two ranks
RANKS_SCRIPT = textwrap.dedent('''
    import json, socket, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from helpers import RegressionModel, regression_data
    from trainwell import Trainer, TrainingArguments
    from trainwell.checkpoint.lock import OutputDirLockedError

    out = Path(sys.argv[1])
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, max_steps=2, save_steps=1,
                             disable_tqdm=True, report_to="none", use_cpu=True)
    try:
        Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(8)).train()
        print(f"rank {args.process_index} TRAINED", flush=True)
    except OutputDirLockedError as err:
        print(f"rank {args.process_index} LOCKED {err}", flush=True)
    # Leave together, with the process group closed: a rank (the TCPStore host) that exits while its gloo threads
    # still run can abort with "terminate called without an active exception".
    import torch.distributed as dist
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
''')


@pytest.mark.slow
def test_every_rank_fails_together_when_the_output_dir_is_locked(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text(json.dumps({"pid": 1, "host": "other-node", "since": "then"}))
    proc = run(torchrun(script, out, REPO / "tests"), "the 2-rank locked job", timeout=300, merge=False)
    assert "rank 0 LOCKED output_dir" in proc.stdout and "rank 1 LOCKED (reported by rank 0) output_dir" in proc.stdout
    assert "other-node" in proc.stdout and "TRAINED" not in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]


def test_an_output_dir_that_cannot_be_locked_trains_with_a_warning(tmp_path, caplog, monkeypatch):
    def read_only(self):
        raise PermissionError(13, "Permission denied", str(self.path))

    monkeypatch.setattr(OutputDirLock, "acquire", read_only)  # as on a read-only mount (root ignores chmod)
    trainer = make_trainer(tmp_path, save_strategy="no")
    trainer.train()
    assert "Could not lock output_dir" in caplog.text and "Permission denied" in caplog.text
    assert trainer.state.global_step == 4


def test_the_lock_record_is_fsynced_only_on_a_file_system_other_hosts_may_share(tmp_path, monkeypatch):
    # The record is read from the page cache on this host; an fsync (milliseconds, before training starts) is only
    # worth it where other hosts read the file (nfs, lustre...). This host's tmp_path is a local file system.
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(lock_module.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    local = OutputDirLock(tmp_path / "local")
    local.acquire()
    record = json.loads((tmp_path / "local" / LOCK_NAME).read_text())
    local.release()
    assert synced == [] and record["pid"] == os.getpid()
    # The same lock where the mount table names no local file system type (as on a network mount): fsynced.
    monkeypatch.setattr(lock_module, "_LOCAL_FS_TYPES", frozenset())
    monkeypatch.setattr(lock_module, "_LOCAL_BY_DEVICE", {})
    shared = OutputDirLock(tmp_path / "shared")
    shared.acquire()
    shared.release()
    assert len(synced) == 1
    assert not (tmp_path / "shared" / LOCK_NAME).exists()
