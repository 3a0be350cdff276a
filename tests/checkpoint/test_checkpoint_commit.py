"""The commit protocol in one process: engine files go into the temporary folder before the marker; a failure of
any writer leaves no checkpoint and the earlier ones intact."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell.checkpoint import layout
from trainwell.checkpoint.digest import hash_file
from trainwell.checkpoint.manager import CheckpointContents, CheckpointManager


def _contents() -> CheckpointContents:
    model = nn.Linear(3, 2)
    return CheckpointContents(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_engine_files_are_written_before_the_marker_and_listed(tmp_path):
    seen = []

    def engine_save(folder: Path) -> None:
        seen.append((folder.name, (folder / layout.COMPLETE_MARKER).exists()))
        (folder / "global_step1").mkdir()
        (folder / "global_step1" / "shard.bin").write_bytes(b"engine bytes")
        (folder / "latest").write_text("global_step1")

    final = CheckpointManager(tmp_path).save(1, _contents(), engine_save=engine_save)
    assert seen[0][0].startswith(".tmp-checkpoint-1-") and seen[0][1] is False
    files = layout.marker_files(final)
    algorithm = layout.read_marker(final)["checksum"]
    for rel in ("global_step1/shard.bin", "latest", "model.safetensors", "optimizer.pt", "rng_state.pth"):
        assert files[rel][algorithm] == hash_file(final / rel, algorithm).digest, rel
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]


def test_a_failing_engine_leaves_no_checkpoint(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _contents())

    def broken(folder: Path) -> None:
        (folder / "half").write_bytes(b"x")
        raise RuntimeError("engine exploded")

    with pytest.raises(RuntimeError, match="engine exploded"):
        manager.save(2, _contents(), engine_save=broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-1"]  # no checkpoint-2, no .tmp- left
    manager.verify(tmp_path / "checkpoint-1")


def test_kill_hook_is_inert_without_the_variable(tmp_path, monkeypatch):
    from trainwell.checkpoint.commit import KILL_ENV, test_hook

    monkeypatch.setenv(KILL_ENV, "files:7:1,rename:3:1")
    test_hook("files", 7, 0)  # another rank
    test_hook("marker", 7, 1)  # another phase
    test_hook("rename", 4, 1)  # another step


def test_without_xxhash_the_marker_uses_blake2b_and_still_verifies(tmp_path, monkeypatch):
    from trainwell.checkpoint import digest

    monkeypatch.setattr(digest, "_xxhash", lambda: None)
    final = CheckpointManager(tmp_path).save(1, _contents())
    assert layout.read_marker(final)["checksum"] == "blake2b_128"
    CheckpointManager(tmp_path).verify(final)
    data = bytearray((final / "optimizer.pt").read_bytes())
    data[-30] ^= 0x10
    (final / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(layout.CheckpointError, match="optimizer.pt: the file's blake2b_128 checksum"):
        CheckpointManager(tmp_path).verify(final)


@pytest.mark.parametrize("phase", ["own files", "engine files"])
def test_an_interrupt_during_the_save_removes_the_temporary_folder(tmp_path, phase):
    """A second Ctrl-C while a checkpoint is written raises KeyboardInterrupt inside the save: the process leaves, and
    its ``.tmp-checkpoint-*`` folder (as large as the checkpoint) goes with it; the earlier checkpoint stays."""
    from trainwell.checkpoint.commit import commit_checkpoint
    from trainwell.checkpoint.ranks import Ranks

    def write(tmp: Path) -> None:
        (tmp / "model.safetensors").write_bytes(b"x" * 1024)
        if phase == "own files":
            raise KeyboardInterrupt

    def engine(tmp: Path) -> None:
        (tmp / "engine.bin").write_bytes(b"y" * 1024)
        raise KeyboardInterrupt

    earlier = commit_checkpoint(tmp_path / "checkpoint-4", 4, Ranks(0, 1), should_save=True,
                                write_files=lambda tmp: (tmp / "model.safetensors").write_bytes(b"ok"))
    with pytest.raises(KeyboardInterrupt):
        commit_checkpoint(tmp_path / "checkpoint-8", 8, Ranks(0, 1), should_save=True, write_files=write,
                          engine_save=engine if phase == "engine files" else None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]
    assert layout.is_complete(earlier) and (earlier / "model.safetensors").read_bytes() == b"ok"


def test_a_full_disk_inside_dcps_checkpoint_exception_says_no_space(tmp_path):
    """FSDP2's save goes through torch DCP, which raises a CheckpointException (a BaseException, not an Exception)
    holding each rank's error; the ENOSPC in it gets the message of every other backend's full disk."""
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    from trainwell.checkpoint.commit import commit_checkpoint
    from trainwell.checkpoint.ranks import Ranks

    earlier = commit_checkpoint(tmp_path / "checkpoint-4", 4, Ranks(0, 1), should_save=True,
                                write_files=lambda tmp: (tmp / "model.safetensors").write_bytes(b"ok"))

    def dcp_save(tmp: Path) -> None:
        (tmp / "fsdp_state").mkdir()
        try:
            raise RuntimeError("enforce fail at inline_container.cc") from OSError(errno.ENOSPC, "No space left")
        except RuntimeError as err:
            raise CheckpointException("CheckpointException ranks:dict_keys([0])", {0: (err, None)}) from None

    with pytest.raises(OSError) as raised:
        commit_checkpoint(tmp_path / "checkpoint-8", 8, Ranks(0, 1), should_save=True,
                          write_files=lambda tmp: (tmp / "model.safetensors").write_bytes(b"x"), engine_save=dcp_save)
    assert raised.value.errno == errno.ENOSPC
    assert str(raised.value).startswith(f"[Errno {errno.ENOSPC}] no space left on the disk of {tmp_path} while "
                                        f"writing checkpoint-8")
    assert f"newest: {earlier}" in str(raised.value) and "save_only_model=True" in str(raised.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]


def test_find_disk_full_looks_into_each_ranks_failure():
    import errno

    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(errno.ENOSPC, "No space left on device")
    other = CheckpointException("two ranks", {0: (ValueError("rank 0: another error"), None), 1: (full, None)})
    assert layout.find_disk_full(other) is full
    assert layout.find_disk_full(CheckpointException("one rank", {0: (ValueError("x"), None)})) is None
