"""Telling a torch extension build (DeepSpeed's ops compile on first use) from a rendezvous hang.

torch builds an extension op under ``TORCH_EXTENSIONS_DIR`` (else ``~/.cache/torch_extensions/<py>_<accelerator>``),
one folder per op, and serialises builds with a ``lock`` file in that folder (``torch.utils.file_baton.FileBaton``:
created with ``O_EXCL``, removed when the build ends; every other process waits while it exists). The first use can
take minutes, and a rank waiting in the rendezvous for the building rank looks hung. A build killed midway leaves
its lock behind and every later process waits on it forever; the lock holds no process id, so such a lock is told
by its age and by no compiler running on this host.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

__all__ = ["STALE_AFTER_S", "build_locks", "compiler_running", "describe_build_locks", "extension_roots"]

#: A lock older than this with no compiler running is left by a killed build (torch writes the build files and
#: starts ninja within seconds of taking the lock, and ninja runs until the build ends).
STALE_AFTER_S = 120.0
_COMPILERS = frozenset({"ninja", "cc1plus", "cc1", "c++", "g++", "gcc", "clang", "clang++", "nvcc", "cicc", "ptxas",
                        "hipcc", "ld", "collect2"})


def extension_roots() -> list[Path]:
    """The folders whose subfolders are torch's per-op build folders (``TORCH_EXTENSIONS_DIR`` when set)."""
    configured = os.environ.get("TORCH_EXTENSIONS_DIR")
    if configured:
        return [Path(configured)]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    try:
        return sorted(p for p in base.iterdir() if p.is_dir() and p.name.startswith(python))
    except OSError:  # no cache yet
        return []


def build_locks(roots: list[Path] | None = None) -> list[Path]:
    """The ``<root>/<op>/lock`` files that exist now (builds in progress or left by a killed build)."""
    found = []
    for root in extension_roots() if roots is None else roots:
        try:
            found.extend(sorted(p for p in root.glob("*/lock") if p.is_file()))
        except OSError:
            continue
    return found


def compiler_running(proc: Path = Path("/proc")) -> bool | None:
    """Whether a build tool (ninja, a C++/CUDA compiler, the linker) runs on this host; None where it cannot be told
    (no ``/proc``)."""
    try:
        entries = [p for p in proc.iterdir() if p.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            name = (entry / "comm").read_text().strip()
        except OSError:  # the process ended meanwhile
            continue
        if name in _COMPILERS:
            return True
    return False


def describe_build_locks(roots: list[Path] | None = None, *, now: float | None = None,
                         compiling: bool | None = None) -> str | None:
    """One sentence about the build lock found (the oldest), or None when there is none. ``compiling`` overrides the
    process scan (tests)."""
    locks = build_locks(roots)
    if not locks:
        return None
    now = time.time() if now is None else now
    ages = []
    for lock in locks:
        try:
            ages.append((now - lock.stat().st_mtime, lock))
        except OSError:  # released meanwhile
            continue
    if not ages:
        return None
    age, lock = max(ages)
    op = lock.parent.name
    if compiling is None:
        compiling = compiler_running()
    if age > STALE_AFTER_S and compiling is False:
        return (f"the torch extension build lock {lock} is {age / 60:.0f} min old and no compiler runs on this host: "
                f"a killed build of the {op!r} op left it, and every DeepSpeed run waits on it forever; delete {lock} "
                "(the next run builds the op again)")
    return (f"a torch extension build is in progress ({op!r}: DeepSpeed compiles its op on first use, which can take "
            f"minutes; lock file {lock}, held for {age:.0f} s so far): the rank building it joins when it ends")
