"""Checksums of checkpoint files, computed while the bytes are written where the writer allows it.

The hash is xxHash's XXH3-128 (``xxhash`` package, several GB/s), or BLAKE2b-128 from the standard library when
``xxhash`` is not installed; the marker records which one was used, so a checkpoint is verified with its own
algorithm.

Writers inside a :func:`recording` block (:func:`write_bytes`, :func:`torch_save`) hash the file as they write it
and record ``{path: FileDigest}``; the commit then hashes only the files written by engines (DeepSpeed, DCP), which
it cannot see being written. Outside a block a writer fsyncs the file when it closes it; inside one the fsync is
the commit's, which syncs every file of the checkpoint once, all together (see :mod:`.commit`). This module imports
neither torch nor numpy at import time.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CHUNK = 8 * 2 ** 20
_recorder: contextvars.ContextVar[dict[str, "FileDigest"] | None] = contextvars.ContextVar("trainwell_digests",
                                                                                          default=None)


def _xxhash() -> Any:
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash


def default_algorithm() -> str:
    """``"xxh3_128"`` when the ``xxhash`` package is installed, else ``"blake2b_128"``."""
    return "xxh3_128" if _xxhash() is not None else "blake2b_128"


def new_hasher(algorithm: str | None = None) -> Any:
    """A hash object (``update``/``hexdigest``) of ``algorithm`` (default: :func:`default_algorithm`)."""
    algorithm = algorithm or default_algorithm()
    if algorithm == "xxh3_128":
        module = _xxhash()
        if module is None:
            raise ValueError("this checkpoint's marker records xxh3_128 checksums, which need the xxhash package: "
                             "pip install xxhash")
        return module.xxh3_128()
    if algorithm == "blake2b_128":
        return hashlib.blake2b(digest_size=16)
    raise ValueError(f"unknown checksum algorithm {algorithm!r} in the checkpoint marker "
                     "(written by a newer trainwell?)")


@dataclass(frozen=True)
class FileDigest:
    """Size and checksum of one file."""

    size: int
    digest: str


def hash_file(path: str | os.PathLike, algorithm: str | None = None) -> FileDigest:
    """Read ``path`` and return its size and checksum."""
    hasher = new_hasher(algorithm)
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
            size += len(chunk)
    return FileDigest(size, hasher.hexdigest())


@contextmanager
def recording() -> Iterator[dict[str, FileDigest]]:
    """Collect ``{absolute path: FileDigest}`` of the files written through this module inside the block.

    The files are closed without an fsync: whoever records them makes them durable (the commit's seal, or
    :func:`trainwell.checkpoint.layout.fsync_files` before a rank reports them).
    """
    found: dict[str, FileDigest] = {}
    token = _recorder.set(found)
    try:
        yield found
    finally:
        _recorder.reset(token)


class HashingWriter:
    """A binary file opened for writing that hashes what goes through ``write`` (for ``torch.save``)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._handle = open(self.path, "wb")
        self._hasher = new_hasher()
        self._size = 0

    def write(self, data: Any) -> int:
        """Write and hash ``data`` (bytes-like)."""
        view = memoryview(data)
        self._hasher.update(view)
        self._size += view.nbytes
        return self._handle.write(view)

    def flush(self) -> None:
        """Flush Python's buffer."""
        self._handle.flush()

    def close(self) -> FileDigest:
        """Flush and close; records the digest when a :func:`recording` block is active (the recorder syncs the
        file later), else fsyncs the file first."""
        found = _recorder.get()
        self._handle.flush()
        if found is None:
            os.fsync(self._handle.fileno())
        self._handle.close()
        result = FileDigest(self._size, self._hasher.hexdigest())
        if found is not None:
            found[str(self.path.resolve())] = result
        return result

    def abort(self) -> None:
        """Close without recording (the write failed)."""
        self._handle.close()


def write_bytes(path: str | os.PathLike, data: bytes) -> FileDigest:
    """Write ``data`` to ``path`` (hashed; recorded, or fsynced outside a :func:`recording` block)."""
    writer = HashingWriter(path)
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    return writer.close()


def torch_save(obj: Any, path: str | os.PathLike) -> FileDigest:
    """``torch.save(obj, path)``, hashing the bytes as torch writes them (recorded, or fsynced outside a
    :func:`recording` block)."""
    import torch

    writer = HashingWriter(path)
    try:
        # torch.save writes to any object with write() (this one hashes as it goes); its annotation says IO[bytes]
        torch.save(obj, writer)  # type: ignore[arg-type]
    except BaseException:
        writer.abort()
        raise
    return writer.close()
