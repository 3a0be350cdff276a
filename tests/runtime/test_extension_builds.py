"""A torch extension build (DeepSpeed's first op build) is told from a rendezvous hang, and a lock left by a killed
build is named for deletion (runtime/extension_builds.py, the rendezvous watch around deepspeed.init_distributed)."""

from __future__ import annotations

import os
import time

import pytest

from trainwell.runtime import extension_builds
from trainwell.runtime.distributed import LaunchEnv, RendezvousWatch


@pytest.fixture
def extensions(tmp_path, monkeypatch):
    """A fake TORCH_EXTENSIONS_DIR holding a built op (no lock) and a folder for an op whose build holds its lock."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "fused_adam").mkdir()
    (tmp_path / "fused_adam" / "fused_adam.so").write_bytes(b"")
    (tmp_path / "cpu_adam").mkdir()
    return tmp_path


def _lock(root, age_s: float):
    lock = root / "cpu_adam" / "lock"
    lock.write_bytes(b"")
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_no_lock_says_nothing(extensions):
    assert extension_builds.build_locks() == []
    assert extension_builds.describe_build_locks(compiling=False) is None


def test_a_build_in_progress_names_the_op_the_lock_and_how_long(extensions):
    lock = _lock(extensions, 95)
    assert extension_builds.build_locks() == [lock]
    said = extension_builds.describe_build_locks(compiling=True, now=lock.stat().st_mtime + 95)
    assert said == (f"a torch extension build is in progress ('cpu_adam': DeepSpeed compiles its op on first use, "
                    f"which can take minutes; lock file {lock}, held for 95 s so far): the rank building it joins "
                    "when it ends")


def test_a_young_lock_is_a_build_even_before_the_compiler_starts(extensions):
    lock = _lock(extensions, 10)
    said = extension_builds.describe_build_locks(compiling=False, now=lock.stat().st_mtime + 10)
    assert said is not None and said.startswith("a torch extension build is in progress")


def test_an_old_lock_with_no_compiler_running_is_named_for_deletion(extensions):
    lock = _lock(extensions, 20 * 60)
    said = extension_builds.describe_build_locks(compiling=False, now=lock.stat().st_mtime + 20 * 60)
    assert said == (f"the torch extension build lock {lock} is 20 min old and no compiler runs on this host: a killed "
                    f"build of the 'cpu_adam' op left it, and every DeepSpeed run waits on it forever; delete {lock} "
                    "(the next run builds the op again)")
    # a long build still compiling is not stale
    assert extension_builds.describe_build_locks(compiling=True).startswith("a torch extension build is in progress")


def test_compiler_running_reads_process_names(tmp_path):
    for pid, name in (("12", "python3\n"), ("40", "ninja\n")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "comm").write_text(name)
    (tmp_path / "self").mkdir()
    assert extension_builds.compiler_running(tmp_path) is True
    (tmp_path / "40" / "comm").write_text("bash\n")
    assert extension_builds.compiler_running(tmp_path) is False
    assert extension_builds.compiler_running(tmp_path / "missing") is None


def test_the_deepspeed_watch_says_build_not_address_while_a_lock_exists(extensions):
    env = LaunchEnv(rank=0, world_size=2, local_rank=0)
    lock = _lock(extensions, 30)
    message = RendezvousWatch(env, 1800, extension_builds=True).message(35)
    assert message.startswith("trainwell: rank 0 hosts the rendezvous at ")
    assert "waits for rank 1 (at least one has not joined): 35 s so far; a torch extension build is in progress " \
           "('cpu_adam'" in message and str(lock) in message
    assert "MASTER_ADDR" not in message
    lock.unlink()
    assert "MASTER_ADDR/MASTER_PORT" in RendezvousWatch(env, 1800, extension_builds=True).message(35)
    _lock(extensions, 30)
    assert "MASTER_ADDR/MASTER_PORT" in RendezvousWatch(env, 1800).message(35)  # other backends: unchanged
