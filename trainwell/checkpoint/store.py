"""Checkpoints on object storage: a mirror of ``output_dir``'s committed checkpoints under an fsspec URL.

``checkpoint_store="s3://bucket/run"`` (any fsspec URL: ``gs://``, ``az://``, ``memory://``...) keeps every
checkpoint the run commits locally (``output_dir`` is the staging folder: the local commit protocol of
:mod:`.commit` is unchanged) also under ``<url>/checkpoint-<step>/``. Object stores have no rename, so a
checkpoint is published without one:

1. ``<url>/checkpoint-<step>/.uploading`` is written first (it names the run: a prefix holding it and no marker is
   trainwell's unfinished upload, which the next upload of that name or the next start removes);
2. every file the local marker lists is uploaded, and its size on the store checked;
3. the completion marker ``.complete`` (the same record as the local one: every file's size and checksum) is
   uploaded LAST, then ``.uploading`` deleted.

A checkpoint on the store is complete (:meth:`CheckpointStore.complete`) only when its marker is there and every
object it lists exists with the recorded size; a download verifies every checksum before the folder is renamed
into ``output_dir``. A kill or a lost connection at any moment of an upload therefore leaves nothing a resume takes.
A deletion (rotation) removes the marker first. Credentials come from the environment / fsspec's configuration or
from ``storage_options`` (a secret field: never written into a checkpoint, a log or a tracker).

Test hook (see :mod:`.commit`): ``TRAINWELL_TEST_KILL_AT=upload:<step>:0`` SIGKILLs the process after the first
object of ``checkpoint-<step>`` is uploaded, ``published:<step>:0`` after every object but the marker.

This module imports neither torch nor numpy; fsspec is imported when a store is used.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from ..utils.checkpoint_names import is_checkpoint_name
from . import layout
from .layout import COMPLETE_MARKER, TMP_PREFIX, CheckpointError
from .lock import OutputDirLockedError

logger = logging.getLogger(__name__)

UPLOADING = ".uploading"
LOCK_OBJECT = ".trainwell-lock.json"
HEARTBEAT_S = 30.0
STALE_S = 120.0  # a lock whose heartbeat is older than this is taken over (its run is gone)
NODES_WAIT_S = 600.0  # one disk per node: how long node 0 waits for the other nodes' uploads of a checkpoint


def is_store_url(value: Any) -> bool:
    """Whether ``value`` is a URL with a protocol (``s3://...``), not a local path."""
    return isinstance(value, str) and "://" in value and not value.startswith("file://")


def parse_storage_options(options: Any) -> dict[str, Any]:
    """``storage_options`` as a dict (a JSON string from the command line is parsed; None is ``{}``)."""
    if options is None or options == "":
        return {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError as err:
            raise ValueError("storage_options must be a dict or a JSON object string (its value is not shown: it "
                             f"may hold credentials): {err.msg}") from None
    if not isinstance(options, dict):
        raise ValueError(f"storage_options must be a dict, not {type(options).__name__}")
    return dict(options)


class CheckpointStore:
    """The checkpoints under one fsspec URL: publish (upload), list the complete ones, download, delete, lock."""

    def __init__(self, url: str, storage_options: Any = None) -> None:
        try:
            import fsspec
        except ImportError as err:
            raise ImportError(f"checkpoint_store={url!r} needs fsspec: pip install 'trainwell[store]' and the file "
                              "system of the URL (s3fs for s3://, gcsfs for gs://, adlfs for az://)") from err

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url, **parse_storage_options(storage_options))
        self.root = str(root).rstrip("/")

    def _key(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _names(self) -> list[str]:
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def _sizes(self, name: str) -> dict[str, int]:
        """``{relative key: size}`` of every object under ``<url>/<name>/``."""
        prefix = self._key(name)
        try:
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            return {}
        start = len(prefix.lstrip("/")) + 1
        return {str(key).lstrip("/")[start:]: int(info.get("size") or 0) for key, info in found.items()
                if info.get("type", "file") != "directory"}

    def read_marker(self, name: str) -> dict[str, Any] | None:
        """The marker record of ``<url>/<name>``, or None when it has none (or an unreadable one)."""
        try:
            record = json.loads(self.fs.cat_file(self._key(name, COMPLETE_MARKER)))
        except (FileNotFoundError, ValueError):
            return None
        return record if layout._is_marker_record(record) else None

    # ---------------------------------------------------------------------------------------------- publish
    def upload(self, folder: Path, *, run: str | None = None, node: int = 0, nodes: int = 1,
               wait_s: float = NODES_WAIT_S) -> int:
        """Publish the committed local checkpoint ``folder`` as ``<url>/<folder.name>/`` (protocol of the module
        docstring); returns the bytes uploaded. A same-named checkpoint on the store is replaced (marker first).

        ``nodes > 1`` (one disk per node): each node's saver calls it with its ``node`` and writes its file list
        (``.node-<node>.json``) first. Node 0 uploads all its files; every other node, once node 0's list is there,
        uploads the files node 0 does not have (its ranks' own) and then ``.node-<node>.done``; node 0 waits (up to
        ``wait_s``) for every node's, and writes the marker listing every node's files, last."""
        from .commit import test_hook  # .commit loads torch: this module imports neither torch nor numpy

        name, record = folder.name, layout.read_marker(folder)
        step = is_checkpoint_name(name)
        if self.read_marker(name) is not None:  # an earlier run's checkpoint of this step: invisible first
            self.fs.rm_file(self._key(name, COMPLETE_MARKER))
        if nodes == 1 and self._sizes(name):  # its objects, or an interrupted upload's (other nodes: kept)
            self.fs.rm(self._key(name), recursive=True)
        self.fs.pipe_file(self._key(name, UPLOADING), json.dumps({"run": run}).encode())
        files = dict(record["files"])
        if nodes > 1:
            self.fs.pipe_file(self._key(name, f".node-{node}.json"), json.dumps(files).encode())
            if node != 0:
                first = self._wait_for(name, ".node-0.json", wait_s, "node 0 did not list its files")
                files = {rel: entry for rel, entry in files.items() if rel not in first}
        total = 0
        for index, (rel, entry) in enumerate(sorted(files.items())):
            self.fs.put_file(str(folder / rel), self._key(name, rel))
            total += int(entry["size"])
            if index == 0:
                test_hook("upload", step if step is not None else -1, node)
        self._check_sizes(name, files)
        if nodes > 1 and node != 0:
            self.fs.pipe_file(self._key(name, f".node-{node}.done"), b"{}")
            return total
        if nodes > 1:
            for other in range(1, nodes):
                self._wait_for(name, f".node-{other}.done", wait_s, f"node {other} did not report its upload")
                extra = self._wait_for(name, f".node-{other}.json", wait_s, f"node {other} did not list its files")
                files.update({rel: entry for rel, entry in extra.items() if rel not in files})
            record = {**record, "files": files}
            self._check_sizes(name, files)
        test_hook("published", step if step is not None else -1, node)
        self.fs.pipe_file(self._key(name, COMPLETE_MARKER), json.dumps(record, indent=1, sort_keys=True).encode())
        for other in range(nodes if nodes > 1 else 0):
            for suffix in ("json", "done"):
                if self.fs.exists(self._key(name, f".node-{other}.{suffix}")):
                    self.fs.rm_file(self._key(name, f".node-{other}.{suffix}"))
        self.fs.rm_file(self._key(name, UPLOADING))
        return total

    def _check_sizes(self, name: str, files: dict[str, Any]) -> None:
        self.fs.invalidate_cache()
        sizes = self._sizes(name)
        for rel, entry in files.items():
            if sizes.get(rel) != entry["size"]:
                raise CheckpointError(f"{self.url}/{name}/{rel}: {sizes.get(rel)} bytes on the store after the "
                                      f"upload, {entry['size']} written locally")

    def _wait_for(self, name: str, obj: str, wait_s: float, what: str) -> Any:
        """The JSON of ``<url>/<name>/<obj>`` once another node wrote it; CheckpointError after ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return json.loads(self.fs.cat_file(self._key(name, obj)))
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise CheckpointError(f"{self.url}/{name}: {what} within {wait_s:.0f} s (its process died or "
                                          "lost the store)") from None
                time.sleep(0.2)
                self.fs.invalidate_cache()

    # ------------------------------------------------------------------------------------------- discovery
    def complete(self) -> list[tuple[str, dict[str, Any]]]:
        """``(name, marker record)`` of every complete checkpoint on the store, oldest first (run by run as
        :func:`layout.order_by_run` orders local folders, by step within a run)."""
        found = []
        for name in self._names():
            step = is_checkpoint_name(name)
            if step is None:
                continue
            record = self.read_marker(name)
            if record is None:
                continue
            sizes = self._sizes(name)
            if all(sizes.get(rel) == entry["size"] for rel, entry in record["files"].items()):
                found.append((step, name, record))
        last: dict[Any, float] = {}
        for _, _, record in found:
            last[record.get("run")] = max(float(record.get("created", 0)), last.get(record.get("run"), 0.0))
        found.sort(key=lambda item: (last[item[2].get("run")], item[0]))
        return [(name, record) for _, name, record in found]

    def unfinished(self) -> list[str]:
        """Names of trainwell's interrupted uploads: an ``.uploading`` object and no marker."""
        return [name for name in self._names() if is_checkpoint_name(name) is not None
                and self.fs.exists(self._key(name, UPLOADING)) and self.read_marker(name) is None]

    def remove_unfinished(self) -> list[str]:
        """Delete trainwell's interrupted uploads (call with the store's lock held); returns their names."""
        names = self.unfinished()
        for name in names:
            self.fs.rm(self._key(name), recursive=True)
        if names:
            logger.warning("removed interrupted checkpoint uploads from %s: %s", self.url, names)
        return names

    # -------------------------------------------------------------------------------------------- download
    def download(self, name: str, output_dir: str | os.PathLike) -> Path:
        """Download complete checkpoint ``name`` into ``output_dir/<name>``, every checksum verified before the
        folder is renamed into place; a complete local copy with the same marker is kept as it is."""
        record = self.read_marker(name)
        if record is None:
            raise CheckpointError(f"{self.url}/{name} is not a complete checkpoint on the store (no marker)")
        final = Path(output_dir) / name
        if layout.is_complete(final):
            try:
                if layout.read_marker(final) == record:
                    return final
            except CheckpointError:
                pass
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{TMP_PREFIX}{name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            for rel in record["files"]:
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self._key(name, rel), str(tmp / rel))
            (tmp / COMPLETE_MARKER).write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
            layout.verify_checkpoint(tmp)  # sizes and checksums of every file, before anything is visible
            layout._replace_folder(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def delete(self, name: str) -> None:
        """Delete trainwell's checkpoint ``name`` from the store: the marker first (never a half-deleted checkpoint
        that looks complete), then every object."""
        if self.read_marker(name) is None:
            return
        self.fs.rm_file(self._key(name, COMPLETE_MARKER))
        self.fs.rm(self._key(name), recursive=True)

    def rotate(self, limit: int | None, *, keep: set[str], current_run: str | None) -> list[str]:
        """Delete the oldest complete checkpoints beyond ``limit``: never the newest nor those of ``keep`` (the best,
        the one just saved); another run's before ``current_run``'s, as the local rotation. Returns their names."""
        if not limit or limit <= 0:
            return []
        found = self.complete()
        if current_run is not None:
            found.sort(key=lambda item: item[1].get("run") == current_run)  # stable: this run's after the others
        if not found:
            return []
        protected = set(keep) | {found[-1][0]}
        keep_count = max(limit, sum(1 for name, _ in found if name in protected))
        deletable = [name for name, _ in found if name not in protected]
        doomed = deletable[: max(0, len(found) - keep_count)]
        for name in doomed:
            logger.info("deleting older checkpoint %s/%s (save_total_limit=%s)", self.url, name, limit)
            self.delete(name)
        return doomed

    # ------------------------------------------------------------------------------------------------- lock
    def _read_lock(self) -> dict[str, Any] | None:
        try:
            record = json.loads(self.fs.cat_file(self._key(LOCK_OBJECT)))
        except (FileNotFoundError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def acquire_lock(self, owner: str) -> None:
        """Take the store's one-run lock for ``owner`` (a unique id of this process's run); raises
        :class:`~trainwell.checkpoint.lock.OutputDirLockedError` while another live run holds it (its heartbeat is
        younger than ``STALE_S``, or its process is alive on this host)."""
        held = self._read_lock()
        if held is not None and held.get("owner") != owner and not _stale(held):
            raise OutputDirLockedError(
                f"checkpoint_store {self.url} is in use by another run (pid {held.get('pid')} on host "
                f"{held.get('host')}, last heartbeat {time.time() - float(held.get('heartbeat', 0)):.0f} s ago); "
                f"wait for it to end, use another URL, or delete {self.url}/{LOCK_OBJECT} once that run is known to "
                f"be over (a lock without a heartbeat for {STALE_S:.0f} s is taken over)")
        self.heartbeat(owner)
        again = self._read_lock()
        if again is None or again.get("owner") != owner:  # another run wrote at the same moment: it wins
            raise OutputDirLockedError(f"checkpoint_store {self.url} was locked by another run starting at the same "
                                       "moment; use another URL or retry once it ends")

    def heartbeat(self, owner: str) -> None:
        """Write (refresh) the lock object of ``owner``."""
        record = {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time()}
        self.fs.pipe_file(self._key(LOCK_OBJECT), json.dumps(record).encode())

    def release_lock(self, owner: str) -> None:
        """Delete the lock object when ``owner`` holds it."""
        held = self._read_lock()
        if held is not None and held.get("owner") == owner:
            self.fs.rm_file(self._key(LOCK_OBJECT))


def _stale(record: dict[str, Any]) -> bool:
    """Whether a lock record's run is gone: its process is dead on this host, or its heartbeat is too old."""
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        if not layout.pid_alive(record["pid"]):
            return True
    return time.time() - float(record.get("heartbeat", 0)) > STALE_S


__all__ = ["CheckpointStore", "LOCK_OBJECT", "UPLOADING", "is_store_url", "parse_storage_options"]
