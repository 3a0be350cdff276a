"""One run per ``output_dir``: a lock file taken by the main process for the duration of ``train()``.

Two trainers writing into one ``output_dir`` overwrite each other's ``checkpoint-<step>`` folders, rotate away each
other's checkpoints and delete each other's temporary folders. :class:`OutputDirLock` makes the second one fail at
once instead, with an error naming the process that holds the folder.

The lock is the file ``output_dir/.trainwell.lock`` holding ``{"pid", "host", "since"}`` (JSON), plus an ``flock``
on it where the platform and file system offer one:

- held by a live process: :class:`OutputDirLockedError` naming its pid, host and start time, and the fix.
- left behind by a dead process (SIGKILL, power loss): the ``flock`` died with its process, or (without ``flock``)
  the recorded pid is not alive on this host; the lock is taken over with a warning.
- recorded by another host: this host cannot tell whether that process still runs (an ``flock`` is not reliably
  shared across hosts on network file systems), so it is treated as held; the error says to delete the lock file
  once that run is known to be over.

Released on exit from ``train()`` (exceptions included): the lock file is deleted, and so is ``output_dir`` when
the lock created it and nothing else was written there. The lock file is trainwell's own: it never enters a
checkpoint folder and does not match any checkpoint name. This module imports neither torch nor numpy.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from .layout import pid_alive

logger = logging.getLogger(__name__)

LOCK_NAME = ".trainwell.lock"

try:  # POSIX
    import fcntl
except ImportError:  # pragma: no cover - Windows: pid/host records only
    fcntl = None  # type: ignore[assignment]


class OutputDirLockedError(RuntimeError):
    """Another process holds the ``output_dir`` lock (the message names it and says how to proceed)."""


def _describe(record: dict[str, Any]) -> str:
    return (f"pid {record.get('pid', '?')} on host {record.get('host', '?')} "
            f"(since {record.get('since', '?')})")


def _read_record(fd: int) -> dict[str, Any]:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    try:
        record = json.loads(b"".join(chunks).decode("utf-8") or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


# File systems of one host's own disks or memory: a lock record written there is seen by every process that can
# open it without an fsync. Anything else (nfs, cifs, lustre, fuse...) gets the fsync.
_LOCAL_FS_TYPES = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs", "ramfs",
                             "apfs", "hfs", "vfat", "exfat", "ntfs3"})


_LOCAL_BY_DEVICE: dict[int, bool] = {}  # st_dev -> local: one read of the mount table per file system


def _is_local_fs(path: Path) -> bool:
    """Whether ``path`` lies on a local file system (Linux ``/proc/self/mounts``; False when it cannot be told)."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return False
    if device not in _LOCAL_BY_DEVICE:
        _LOCAL_BY_DEVICE[device] = _mount_is_local(path)
    return _LOCAL_BY_DEVICE[device]


def _mount_is_local(path: Path) -> bool:
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as mounts:
            entries = [line.split() for line in mounts]
        target = os.path.realpath(path)
    except OSError:
        return False
    best, fs_type = -1, ""
    for entry in entries:
        if len(entry) < 3:
            continue
        point = entry[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:  # the last, longest mount point holding the path is the one in use
            best, fs_type = len(point), entry[2]
        elif inside and len(point) == best:
            fs_type = entry[2]
    return fs_type in _LOCAL_FS_TYPES


class OutputDirLock:
    """The lock of one ``output_dir``; :meth:`acquire` raises :class:`OutputDirLockedError` when it is taken.

    Usable as a context manager. ``acquire`` creates ``output_dir`` when missing.
    """

    def __init__(self, output_dir: str | os.PathLike) -> None:
        self.output_dir = Path(output_dir)
        self.path = self.output_dir / LOCK_NAME
        self._fd: int | None = None
        self._flock: bool | None = None
        self._created_dir = False

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def _error(self, record: dict[str, Any], why: str) -> OutputDirLockedError:
        return OutputDirLockedError(
            f"output_dir {self.output_dir} is in use by another trainer: {_describe(record)} holds {self.path}{why}. "
            "Two runs in one output_dir overwrite and rotate away each other's checkpoints: wait for that run to "
            "finish, or give this run another output_dir (overwrite_output_dir does not change this)")

    def _try_flock(self, fd: int) -> bool | None:
        """True: locked; False: held by another process; None: no flock on this platform or file system."""
        if fcntl is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        except OSError:  # ENOLCK, EOPNOTSUPP, ENOSYS...: the file system has no flock
            return None
        return True

    def _open(self) -> int:
        """Open the lock file, creating it; retry when a releasing holder unlinked the file we opened."""
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
            locked = self._try_flock(fd)
            if locked is False:
                record = _read_record(fd)
                os.close(fd)
                raise self._error(record, "")
            try:
                same_file = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same_file = False
            if same_file:
                self._flock = locked
                return fd
            os.close(fd)  # the previous holder released (unlinked) it between our open and our flock
        raise OutputDirLockedError(f"{self.path}: the lock file keeps being replaced by another process")

    def acquire(self) -> None:
        """Take the lock (see the module docstring); raises :class:`OutputDirLockedError` when it is held."""
        if self._fd is not None:
            return
        if not self.output_dir.is_dir():
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._created_dir = True
        fd = self._open()
        try:
            record = _read_record(fd)
            self._check_previous(record)
            own = {"pid": os.getpid(), "host": socket.gethostname(),
                   "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
            if os.fstat(fd).st_size:  # an earlier holder's record: replaced. A new file is not truncated: ext4 flushes
                os.ftruncate(fd, 0)  # a file truncated to 0 and rewritten when it is closed (auto_da_alloc), ~5 ms
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, (json.dumps(own) + "\n").encode("utf-8"))
            # Processes of this host read the record from the page cache; only the hosts of a network file system
            # need it on the server. A local fsync costs milliseconds (and as much again at the unlink in release).
            if not _is_local_fs(self.output_dir):
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd

    def _check_previous(self, record: dict[str, Any]) -> None:
        """Decide about a record left in the file by an earlier holder (we hold the flock, if there is one)."""
        pid, host = record.get("pid"), record.get("host")
        if not isinstance(pid, int):
            return  # a new (empty) lock file
        if host != socket.gethostname():
            raise self._error(record, (
                "; that host's processes cannot be checked from here (and flock is not reliably shared between "
                f"hosts), so if that run is over (e.g. it was killed), delete {self.path} and start again"))
        if self._flock is None and pid != os.getpid() and pid_alive(pid):
            raise self._error(record, "")
        logger.warning("taking over the lock %s left by %s, which is no longer running", self.path, _describe(record))

    def release(self) -> None:
        """Delete the lock file and release the lock; removes ``output_dir`` if the lock created it and it is empty."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if os.path.samestat(os.fstat(fd), os.stat(self.path)):
                self.path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the flock
        if self._created_dir:
            try:
                self.output_dir.rmdir()  # only succeeds when nothing else was written there
            except OSError:
                pass

    def __enter__(self) -> OutputDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
