"""``async_save=True`` with 2 ranks (torchrun, gloo, CPU): the background commit runs on its own gloo group.

DDP: an asynchronous run writes the same checkpoints as a synchronous one; a SIGKILL of a rank during the background
write leaves the previous checkpoint the newest valid one and the relaunch ends on the uninterrupted run's weights
(``torch.equal``); a background write that fails on rank 1 (or a failure only rank 0 saw) is raised as
CheckpointError on both ranks, at the same step; the save made on SIGTERM is committed before ``train()`` returns.
FSDP2 the same: the shards are copied to host memory in the training thread and written by DCP in the background.
ZeroRedundancyOptimizer (``sharded_ddp``), whose state is consolidated with collectives on the training group,
refuses ``async_save`` when the Trainer is built (DeepSpeed: ``tests/checkpoint/test_checkpoint_async.py``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, start, torchrun, wait
from trainwell.checkpoint.layout import COMPLETE_MARKER, list_complete_checkpoints, read_marker, verify_checkpoint
from helpers.tensors import final_weights

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

JOB = Path(__file__).with_name("async_save_job.py")
TIMEOUT_S = 400
STEPS = (3, 6, 9, 12)


def _start(out: Path, mode: str, **extra_env: str) -> subprocess.Popen:
    env = child_env(drop=("TRAINWELL_TEST_KILL_AT", "FAIL_RNG_WRITE_AT", "SYNC_STEPS"), **extra_env)
    return start(torchrun(JOB, out, mode), env=env, merge=False)


def _finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    return wait(proc, "the 2-rank job", timeout=TIMEOUT_S, check=False)


def _begin_steps(log: str) -> dict[int, int]:
    return {int(r): int(step) for r, step in re.findall(r"RANK(\d) BEGIN_STEP (\d+)", log)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted synchronous and one asynchronous 2-rank run, launched side by side."""
    root = tmp_path_factory.mktemp("async_ranks")
    procs = {mode: _start(root / mode, mode) for mode in ("sync", "async")}
    for mode, proc in procs.items():
        done = _finish(proc)
        assert done.returncode == 0, f"{mode}:\n{done.stderr[-4000:]}"
    return {mode: root / mode for mode in procs}


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if hasattr(a, "dtype") and hasattr(a, "shape"):  # numpy arrays in the RNG state
        return bool((a == b).all())
    return a == b


def test_async_and_sync_ddp_checkpoints_hold_the_same_files(reference):
    sync, async_ = reference["sync"], reference["async"]
    names = [f"checkpoint-{s}" for s in STEPS]
    assert [p.name for p in list_complete_checkpoints(sync)] == names
    assert [p.name for p in list_complete_checkpoints(async_)] == names
    for name in names:
        a, s = async_ / name, sync / name
        verify_checkpoint(a)
        files_a, files_s = read_marker(a)["files"], read_marker(s)["files"]
        assert sorted(files_a) == sorted(files_s)
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(files_a)
        for file in ("model.safetensors", "data_state.json", "trainer_state.json"):
            assert files_a[file] == files_s[file], (name, file)  # size and checksum
        for file in ("optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"):
            # torch.save stamps a serialization id: compare sizes and the loaded values
            assert files_a[file]["size"] == files_s[file]["size"], (name, file)
            assert _same(torch.load(a / file, weights_only=False), torch.load(s / file, weights_only=False)), file
    want, got = final_weights(sync), final_weights(async_)
    assert sorted(want) == sorted(got) and all(torch.equal(got[k], v) for k, v in want.items())


@pytest.fixture(scope="module")
def fsdp_reference(tmp_path_factory):
    """The same two runs with FSDP2 (``full_shard``): the sharded state goes through DCP on the saver's group."""
    root = tmp_path_factory.mktemp("async_fsdp")
    procs = {mode: _start(root / mode, mode) for mode in ("sync-fsdp", "async-fsdp")}
    for mode, proc in procs.items():
        done = _finish(proc)
        assert done.returncode == 0, f"{mode}:\n{done.stderr[-4000:]}"
    return {mode: root / mode for mode in procs}


def test_async_and_sync_fsdp_checkpoints_hold_the_same_shards(fsdp_reference):
    sync, async_ = fsdp_reference["sync-fsdp"], fsdp_reference["async-fsdp"]
    names = [f"checkpoint-{s}" for s in STEPS]
    assert [p.name for p in list_complete_checkpoints(async_)] == [p.name for p in list_complete_checkpoints(sync)] \
        == names
    for name in names:
        verify_checkpoint(async_ / name)
        files_a, files_s = read_marker(async_ / name)["files"], read_marker(sync / name)["files"]
        assert sorted(files_a) == sorted(files_s)
        shards = [f for f in files_a if f.startswith("fsdp_state/") and f.endswith(".distcp")]
        assert len(shards) == 2 and "fsdp_state/.metadata" in files_a
        for file in [*shards, "model.safetensors", "data_state.json", "trainer_state.json"]:
            assert files_a[file] == files_s[file], (name, file)  # size and checksum
    want, got = final_weights(sync), final_weights(async_)
    assert sorted(want) == sorted(got) and all(torch.equal(got[k], v) for k, v in want.items())


def test_fsdp_rank_killed_during_the_background_dcp_write_resumes_bit_exactly(fsdp_reference, tmp_path):
    """Rank 1 dies after DCP wrote its shard on the saver thread, before the ranks compare reports."""
    out = tmp_path / "out"
    killed = _finish(_start(out, "async-fsdp", TRAINWELL_TEST_KILL_AT="engine:6:1"))
    log = killed.stdout + killed.stderr
    assert killed.returncode != 0 and "(exitcode: -9) local_rank: 1" in log, log[-4000:]
    assert list_complete_checkpoints(out)[-1].name == "checkpoint-3"
    resumed = _finish(_start(out, "async-fsdp"))
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    assert _begin_steps(log) == {0: 3, 1: 3}
    want, got = final_weights(fsdp_reference["sync-fsdp"]), final_weights(out)
    assert sorted(want) == sorted(got) and all(torch.equal(got[k], v) for k, v in want.items())


@pytest.mark.parametrize(("kill_at", "newest", "resumes_at"), [
    ("files:6:1", "checkpoint-3", 3),  # rank 1 dies after writing its RNG file, in the background: no checkpoint-6
    ("rename:9:0", "checkpoint-6", 9),  # rank 0 dies after the marker, before the rename: the resume promotes it
])
def test_a_rank_killed_during_the_background_write_resumes_bit_exactly(reference, tmp_path, kill_at, newest,
                                                                      resumes_at):
    out = tmp_path / "out"
    killed = _finish(_start(out, "async", TRAINWELL_TEST_KILL_AT=kill_at))
    log = killed.stdout + killed.stderr
    assert killed.returncode != 0 and f"(exitcode: -9) local_rank: {kill_at[-1]}" in log, log[-4000:]
    complete = list_complete_checkpoints(out)
    assert complete[-1].name == newest, [p.name for p in complete]
    for folder in complete:
        verify_checkpoint(folder)
    assert not (out / "final.safetensors").exists()
    resumed = _finish(_start(out, "async"))
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    assert _begin_steps(log) == {0: resumes_at, 1: resumes_at}
    want, got = final_weights(reference["sync"]), final_weights(out)
    assert sorted(want) == sorted(got)
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize(("sync_steps", "raised_at"), [(None, 9), ("1", 7)])
def test_a_background_write_failing_on_rank_1_is_raised_on_both_ranks(tmp_path, sync_steps, raised_at):
    """The failed commit of checkpoint-6 ends before step 7 (JOIN_SAVE_AT). The ranks agree on a stop or a failure
    every ``preemption_sync_steps``: by default (10) the next save raises it (step 9); agreeing at every step, step
    7 does. Both ranks raise at the same step."""
    out = tmp_path / "out"
    env = {"FAIL_RNG_WRITE_AT": "6:1", "JOIN_SAVE_AT": "6", **({"SYNC_STEPS": sync_steps} if sync_steps else {})}
    errors = _failed_run(out, env)
    assert errors[0][0] == errors[1][0] == raised_at, errors
    for _, message in errors.values():
        first_line = message.splitlines()[0]  # names the cause on both ranks, and the save
        assert "No space left on device (test, rank 1)" in first_line and "checkpoint-6" in first_line, message
    assert [p.name for p in list_complete_checkpoints(out)] == ["checkpoint-3"]
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]  # the failed save's folder was removed
    assert not (out / "checkpoint-6").exists() and not (out / COMPLETE_MARKER).exists()


def test_a_failure_only_rank_0_saw_is_raised_on_both_ranks(tmp_path):
    """Rank 0's rotation after checkpoint-6 fails (the commit itself succeeded on both ranks)."""
    out = tmp_path / "out"
    errors = _failed_run(out, {"FAIL_ROTATION_AT": "6:0", "JOIN_SAVE_AT": "6", "SYNC_STEPS": "1"})
    assert errors[0][0] == errors[1][0] == 7, errors
    assert "rotation failed (test, rank 0)" in errors[0][1]
    assert "failed on rank(s) 0: OSError: rotation failed (test, rank 0)" in errors[1][1], errors[1][1]
    assert [p.name for p in list_complete_checkpoints(out)] == ["checkpoint-3", "checkpoint-6"]


def test_the_preemption_save_is_committed_before_train_returns_and_resumes_bit_exactly(reference, tmp_path):
    """SIGTERM on rank 0 at step 4; the ranks agree at every step (SYNC_STEPS=1), save checkpoint-4 in the
    background and stop: train() returns on both ranks with it committed; the relaunch ends on the reference."""
    out = tmp_path / "out"
    proc = _finish(_start(out, "async", TERM_AT_STEP="4:0", SYNC_STEPS="1"))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert set(re.findall(r"RANK\d PREEMPTED .*", log)) == {"RANK0 PREEMPTED 4 checkpoint-4 False",
                                                             "RANK1 PREEMPTED 4 checkpoint-4 False"}, log[-4000:]
    verify_checkpoint(out / "checkpoint-4")
    resumed = _finish(_start(out, "async"))
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-6000:]
    assert _begin_steps(log) == {0: 4, 1: 4}
    want, got = final_weights(reference["sync"]), final_weights(out)
    assert sorted(want) == sorted(got) and all(torch.equal(got[k], v) for k, v in want.items())


def _failed_run(out: Path, env: dict[str, str]) -> dict[int, tuple[int, str]]:
    """Run the async job with ``env``; every rank's ``(step, message)`` of the CheckpointError train() raised."""
    proc = _finish(_start(out, "async", **env))
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log[-4000:]
    errors = {int(r): (int(step), msg) for r, step, msg in re.findall(r"RANK(\d) CHECKPOINT_ERROR (\d+) (.*)", log)}
    assert set(errors) == {0, 1}, log[-4000:]
    return errors


def test_engines_that_write_their_own_checkpoint_refuse_async_save(tmp_path):
    proc = _finish(_start(tmp_path / "out", "refused"))
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    for rank in (0, 1):
        for backend, engine in (("DDPBackend", "ZeroRedundancyOptimizer state of sharded_ddp"),):
            line = re.search(rf"RANK{rank} REFUSED {backend} (.*)", log)
            assert line is not None, log[-4000:]
            assert f"async_save=True is not supported by the {backend} backend" in line.group(1)
            assert engine in line.group(1) and "set async_save=False" in line.group(1)
