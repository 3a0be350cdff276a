"""Crash-safe checkpoint folders: atomic writes, markers, discovery, clean-up."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainwell.checkpoint.layout import (
    COMPLETE_MARKER,
    CheckpointError,
    atomic_checkpoint_dir,
    cleanup_incomplete,
    delete_checkpoint,
    is_complete,
    list_complete_checkpoints,
    list_foreign_checkpoints,
    list_incomplete,
    list_resumable_checkpoints,
    verify_checkpoint,
    write_atomic,
)
from trainwell.trainer_utils import get_last_checkpoint
from helpers.launch import dead_pid


def _save(root: Path, step: int, payload: bytes = b"weights") -> Path:
    with atomic_checkpoint_dir(root / f"checkpoint-{step}") as tmp:
        (tmp / "model.bin").write_bytes(payload)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "tok.json").write_text("{}")
    return root / f"checkpoint-{step}"


def test_atomic_dir_success_writes_marker_with_file_list(tmp_path):
    final = _save(tmp_path, 5)
    assert is_complete(final)
    assert (final / "model.bin").read_bytes() == b"weights"
    record = json.loads((final / COMPLETE_MARKER).read_text())
    algorithm = record["checksum"]
    assert {rel: entry["size"] for rel, entry in record["files"].items()} == {"model.bin": 7, "sub/tok.json": 2}
    from trainwell.checkpoint.digest import hash_file

    assert record["files"]["model.bin"][algorithm] == hash_file(final / "model.bin", algorithm).digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]  # no temp folder left


def test_atomic_dir_exception_leaves_nothing_and_keeps_old(tmp_path):
    old = _save(tmp_path, 1, b"old")
    with pytest.raises(OSError, match="disk full"):
        with atomic_checkpoint_dir(tmp_path / "checkpoint-2") as tmp:
            (tmp / "model.bin").write_bytes(b"half")
            assert not (tmp / COMPLETE_MARKER).exists()  # the marker only comes on success
            raise OSError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]
    assert (old / "model.bin").read_bytes() == b"old" and is_complete(old)


def test_atomic_dir_resave_same_step_replaces(tmp_path):
    _save(tmp_path, 3, b"first")
    final = _save(tmp_path, 3, b"second!")
    assert (final / "model.bin").read_bytes() == b"second!"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]  # old copy moved aside and deleted


@pytest.mark.slow
def test_listing_ignores_incomplete_and_cleanup_removes_them(tmp_path):
    _save(tmp_path, 10)
    _save(tmp_path, 2)
    (tmp_path / "checkpoint-30").mkdir()  # no marker: another tool's checkpoint, never trainwell's to delete
    dead = tmp_path / f".tmp-checkpoint-40-{dead_pid()}"
    dead.mkdir()  # trainwell crashed while writing
    live = tmp_path / f".tmp-checkpoint-50-{os.getpid()}"
    live.mkdir()  # a save in progress in a live process
    (tmp_path / "checkpoint-abc").mkdir()  # not a checkpoint name
    (tmp_path / "notes.txt").write_text("x")
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-10"]
    assert [p.name for p in list_foreign_checkpoints(tmp_path)] == ["checkpoint-30"]
    assert [p.name for p in list_resumable_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-10", "checkpoint-30"]
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-30")  # as upstream: any checkpoint-N
    assert list_incomplete(tmp_path) == [dead]
    assert cleanup_incomplete(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == [live.name, "checkpoint-10", "checkpoint-2", "checkpoint-30",
                                                          "checkpoint-abc", "notes.txt"]


def test_foreign_folder_is_never_deleted_nor_replaced(tmp_path):
    foreign = tmp_path / "checkpoint-3"
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"theirs")
    delete_checkpoint(foreign)  # rotation's delete refuses folders without the marker
    with pytest.raises(CheckpointError, match=r"checkpoint-3 already exists and was not written by trainwell"):
        _save(tmp_path, 3)
    assert (foreign / "model.safetensors").read_bytes() == b"theirs"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-3"]  # no temporary folder left either


def test_delete_checkpoint_never_leaves_a_partial_checkpoint_name(tmp_path, monkeypatch):
    final = _save(tmp_path, 4)
    import shutil

    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)  # the process dies before the files are gone
    delete_checkpoint(final)
    assert not final.exists()
    assert [p.name for p in tmp_path.iterdir()] == [f".tmp-checkpoint-4-{os.getpid()}.del"]
    monkeypatch.undo()
    cleanup_incomplete(tmp_path, at_startup=True)  # a deletion's left-over is removed, never promoted back
    assert list(tmp_path.iterdir()) == []


class _Killed(BaseException):
    """Stands for a SIGKILL: nothing after it runs (a BaseException, so no ``except Exception`` catches it)."""


def _kill_at(monkeypatch, nth: int) -> list[str]:
    """Make the ``nth`` file-system call of the code under test (rename, unlink, rmtree, fsync) raise ``_Killed``."""
    import shutil

    calls: list[str] = []

    def wrap(owner, name):
        real = getattr(owner, name)

        def fake(*args, **kwargs):
            calls.append(name)
            if len(calls) == nth:
                raise _Killed(name)
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, fake)

    for owner, name in ((os, "rename"), (os, "unlink"), (shutil, "rmtree"), (os, "fsync")):
        wrap(owner, name)
    return calls


def test_rotation_killed_at_every_file_system_call_never_leaves_a_foreign_checkpoint(tmp_path, monkeypatch):
    for nth in range(1, 20):
        root = tmp_path / str(nth)
        final = _save(root, 4)
        with monkeypatch.context() as patch:
            calls = _kill_at(patch, nth)
            try:
                delete_checkpoint(final)
            except _Killed:
                pass
            else:  # the deletion ran to its end before the nth call: every window has been tried
                assert nth > len(calls) and not any(root.iterdir())
                break
        assert list_foreign_checkpoints(root) == [], (nth, calls)  # never a checkpoint-4 without its marker
        cleanup_incomplete(root, at_startup=True)  # the next start (same pid: a fresh PID namespace)
        assert [p.name for p in root.iterdir()] in ([], ["checkpoint-4"]), (nth, calls)
        if final.exists():
            verify_checkpoint(final)  # what survives is the complete, intact checkpoint
    else:
        pytest.fail("delete_checkpoint made more file-system calls than tried")
    assert nth > 2  # the rename, the marker's unlink and the rmtree were each interrupted


def test_emptied_marker_is_damage_not_a_checkpoint_without_checksums(tmp_path):
    final = _save(tmp_path, 2, b"0123456789")
    (final / COMPLETE_MARKER).write_text("")
    with pytest.raises(CheckpointError, match=r"completion marker is empty.*resume from another checkpoint"):
        verify_checkpoint(final)


def test_cleanup_at_startup_treats_this_pid_as_a_dead_incarnation(tmp_path):
    done = _save(tmp_path, 7, b"new")
    own = tmp_path / f".tmp-checkpoint-7-{os.getpid()}"
    os.rename(done, own)  # sealed, not renamed: the earlier incarnation died between marker and rename
    (tmp_path / f".tmp-checkpoint-9-{os.getpid()}").mkdir()  # unsealed
    assert cleanup_incomplete(tmp_path) == [] and own.exists()  # mid-run: a live save of this process
    assert cleanup_incomplete(tmp_path, at_startup=True) == [tmp_path / f".tmp-checkpoint-9-{os.getpid()}"]
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-7"]
    assert (tmp_path / "checkpoint-7" / "model.bin").read_bytes() == b"new"


def test_a_sealed_folder_finishes_its_replace_of_an_older_same_named_checkpoint(tmp_path):
    """A process died after sealing ``.tmp-checkpoint-6-<pid>``, before replacing the earlier ``checkpoint-6``: the
    next start finishes the replace (before: the sealed folder was deleted as "incomplete"). An older sealed folder
    than the one in place, or one beside a folder trainwell did not write, never replaces it."""
    older = _save(tmp_path / "a", 6, b"earlier run")
    newer = _save(tmp_path / "b", 6, b"new run")
    pid = os.getpid()  # at_startup: this pid's folders are a dead incarnation's (no dead_pid: a process)
    os.rename(older, tmp_path / "checkpoint-6")
    os.rename(newer, tmp_path / f".tmp-checkpoint-6-{pid}")
    recovered: list[Path] = []
    assert cleanup_incomplete(tmp_path, at_startup=True, recovered=recovered) == []
    assert recovered == [tmp_path / "checkpoint-6"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "checkpoint-6"]
    assert (tmp_path / "checkpoint-6" / "model.bin").read_bytes() == b"new run"
    verify_checkpoint(tmp_path / "checkpoint-6")
    stale = _save(tmp_path / "c", 6, b"stale")  # sealed before the one in place: a left-over, removed
    (tmp_path / "c" / "checkpoint-6" / COMPLETE_MARKER).write_text(json.dumps(
        {**json.loads((stale / COMPLETE_MARKER).read_text()), "created": 1.0}))
    os.rename(stale, tmp_path / f".tmp-checkpoint-6-{pid}")
    assert cleanup_incomplete(tmp_path, at_startup=True) == [tmp_path / f".tmp-checkpoint-6-{pid}"]
    assert (tmp_path / "checkpoint-6" / "model.bin").read_bytes() == b"new run"
    foreign = tmp_path / "f" / "checkpoint-6"
    foreign.mkdir(parents=True)
    os.rename(_save(tmp_path / "d", 6, b"x"), tmp_path / "f" / f".tmp-checkpoint-6-{pid}")
    cleanup_incomplete(tmp_path / "f", at_startup=True)
    assert [p.name for p in (tmp_path / "f").iterdir()] == ["checkpoint-6"] and not any(foreign.iterdir())


def _fsync_failing_on_folders(monkeypatch, code: int) -> None:
    import stat

    real = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_eio_from_the_folder_fsync_after_the_rename_is_raised(tmp_path, monkeypatch):
    import errno

    _fsync_failing_on_folders(monkeypatch, errno.EIO)
    with pytest.raises(OSError, match=r"fsync of the folder .* failed .*may not be on disk") as info:
        _save(tmp_path, 3)
    assert info.value.errno == errno.EIO


@pytest.mark.parametrize("name", ["EINVAL", "ENOTSUP", "ENOSYS"])
def test_folder_fsync_not_supported_by_the_file_system_is_ignored(tmp_path, monkeypatch, name):
    import errno

    _fsync_failing_on_folders(monkeypatch, getattr(errno, name))
    final = _save(tmp_path, 3)
    verify_checkpoint(final)


def test_missing_output_dir_lists_nothing(tmp_path):
    assert list_complete_checkpoints(tmp_path / "nope") == []
    assert list_incomplete(tmp_path / "nope") == []
    assert cleanup_incomplete(tmp_path / "nope") == []
    assert get_last_checkpoint(tmp_path / "nope") is None


@pytest.mark.slow
def test_cleanup_recovers_complete_temp_when_final_missing(tmp_path):
    done = _save(tmp_path, 7, b"new")
    os.rename(done, tmp_path / f".tmp-checkpoint-7-{dead_pid()}")  # crash between "move old aside" and "rename new"
    cleanup_incomplete(tmp_path)
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["checkpoint-7"]
    assert (tmp_path / "checkpoint-7" / "model.bin").read_bytes() == b"new"


def test_verify_checkpoint_detects_truncation_and_deletion(tmp_path):
    final = _save(tmp_path, 1, b"0123456789")
    verify_checkpoint(final)
    with open(final / "model.bin", "r+b") as handle:
        handle.truncate(4)
    with pytest.raises(CheckpointError, match=r"model\.bin.*4 bytes but 10"):
        verify_checkpoint(final)
    (final / "model.bin").unlink()
    with pytest.raises(CheckpointError, match=r"model\.bin: file is missing"):
        verify_checkpoint(final)
    (final / COMPLETE_MARKER).unlink()
    with pytest.raises(CheckpointError, match=r"marker file .*\.complete is missing"):
        verify_checkpoint(final)


def test_delete_checkpoint_and_write_atomic(tmp_path):
    final = _save(tmp_path, 1)
    delete_checkpoint(final)
    assert not final.exists()
    target = tmp_path / "state.json"
    write_atomic(target, "one")
    write_atomic(target, lambda p: p.write_bytes(b"two"))
    assert target.read_text() == "two"

    def failing(path: Path) -> None:
        path.write_bytes(b"partial")
        raise OSError("disk full")

    with pytest.raises(OSError):
        write_atomic(target, failing)
    assert target.read_text() == "two"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
