"""Making checkpoint files and folders durable: each file's fsync, each folder's, and batches of them run together.

An fsync on ext4 or XFS waits for a commit of the file system's journal and a cache flush of the device; the
journal commits concurrent fsyncs together (group commit), so :func:`_together` runs a batch at once, a thread per
call, and the batch costs about one commit. Why the commit protocol syncs what it syncs: :mod:`.commit`.

This module imports neither torch nor numpy.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from .digest import FileDigest, default_algorithm, hash_file

COMPLETE_MARKER = ".complete"  # the completion marker's name (layout re-exports it): written after the tree's sync

# errnos of a directory fsync that mean "this file system cannot fsync a directory" (ignored); any other error
# (EIO above all) means the rename may not be durable and is raised.
_FSYNC_UNSUPPORTED = frozenset(code for code in (
    errno.EINVAL, getattr(errno, "ENOTSUP", None), getattr(errno, "EOPNOTSUPP", None), errno.ENOSYS, errno.EBADF,
    errno.EISDIR) if code is not None)


def _fsync_dir(path: Path) -> None:
    """fsync a directory (makes a rename in it durable); raises unless the file system cannot fsync directories."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; their metadata is durable on close there
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _FSYNC_UNSUPPORTED:
            raise OSError(err.errno, f"fsync of the folder {path} failed ({err.strerror}): the renames in it may not "
                          "be on disk; check the disk (dmesg) before trusting its checkpoints") from err
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as handle:
        os.fsync(handle.fileno())


# At most this many fsyncs in flight at once (one thread each): concurrent fsyncs of one file system are committed
# together by its journal (ext4's and XFS's group commit), so a batch costs about one commit, not one per file.
_SYNC_THREADS = 16


def _together(calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` concurrently (a thread each, up to ``_SYNC_THREADS``) and return their results in order; the
    first error is raised once every call has returned."""
    if len(calls) <= 1:
        return [call() for call in calls]
    with ThreadPoolExecutor(max_workers=min(_SYNC_THREADS, len(calls)), thread_name_prefix="trainwell-fsync") as pool:
        futures = [pool.submit(call) for call in calls]
    return [future.result() for future in futures]


def fsync_files(paths: Iterable[str | os.PathLike]) -> None:
    """fsync every file of ``paths``, concurrently (a rank's own checkpoint files before it reports them)."""
    _together([partial(_fsync_file, Path(path)) for path in paths])


def _fsync_tree(root: Path, known: Mapping[str, FileDigest] | None = None,
                unsynced: Collection[str] = ()) -> dict[str, dict]:
    """Make every file under ``root`` durable; returns ``{relative posix path: {"size", <algorithm>}}``.

    Files in ``known`` (absolute path -> digest recorded while they were written) are not read again, and not
    synced again unless their path is in ``unsynced`` (hashed while written, not yet fsynced); every other file
    (written by an engine: DeepSpeed, DCP) is fsynced and hashed here. The fsyncs run concurrently. Folders are not
    synced here: :func:`write_marker` syncs them once the marker is among their entries.
    """
    algorithm = default_algorithm()
    known = known or {}
    unsynced = frozenset(unsynced)
    files: dict[str, dict] = {}
    pending: list[tuple[str, Callable[[], FileDigest]]] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == COMPLETE_MARKER:
                continue
            resolved = str(path.resolve())
            found = known.get(resolved)
            if found is not None and found.size == path.stat().st_size:
                files[rel] = {"size": found.size, algorithm: found.digest}
                if resolved in unsynced:
                    pending.append((rel, partial(_sync_known, path, found)))
            else:
                pending.append((rel, partial(_sync_and_hash, path, algorithm)))
    for (rel, _), found in zip(pending, _together([call for _, call in pending])):
        files[rel] = {"size": found.size, algorithm: found.digest}
    return dict(sorted(files.items()))


def _sync_known(path: Path, found: FileDigest) -> FileDigest:
    _fsync_file(path)
    return found


def _sync_and_hash(path: Path, algorithm: str) -> FileDigest:
    _fsync_file(path)
    return hash_file(path, algorithm)
