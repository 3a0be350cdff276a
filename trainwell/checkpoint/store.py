"""Checkpoints on object storage: a mirror of ``output_dir``'s committed checkpoints under an fsspec URL.

``checkpoint_store="s3://bucket/run"`` (any fsspec URL: ``gs://``, ``az://``, ``memory://``...) keeps every
checkpoint the run commits locally (``output_dir`` is the staging folder: the local commit protocol of
:mod:`.commit` is unchanged) also under ``<url>/checkpoint-<step>/``. Object stores have no rename, so a
checkpoint is published without one:

1. ``<url>/checkpoint-<step>/.uploading`` is written first (its run, lock owner, host, pid and a heartbeat the
   uploader's lease thread refreshes every ``HEARTBEAT_S``: a prefix holding it and no marker is trainwell's
   unfinished upload, removed by the next start or rotation once its heartbeat is older than ``STALE_S`` or its
   process is gone; a live one is never removed, not even by the next upload of that name);
2. every file the local marker lists is uploaded, and its size on the store checked;
3. the lock is read (still this run's?), then the completion marker ``.complete`` is uploaded LAST (the local record:
   every file's size and checksum, plus ``objects``: each object's fingerprint on the store, its ETag where the store
   has one), then ``.uploading`` deleted.

A checkpoint on the store is complete (:meth:`CheckpointStore.complete`) only when its marker is there and every
object it lists exists with the recorded size and fingerprint (an object another writer replaced, even with as many
bytes, no longer counts); a download verifies every checksum before the folder is renamed into ``output_dir``. A kill
or a lost connection at any moment of an upload therefore leaves nothing a resume takes. A deletion (rotation) writes
``.deleting`` first, then removes the marker, the objects, and ``.deleting`` last: a deletion a kill interrupted is
finished by the next start or rotation. Every destructive act (replacing, rotating, cleaning up) first reads the
lock: when another run holds it now, :class:`StoreLockLostError` stops this run's uploads and is raised to the
training thread at its next save. Credentials come from the environment / fsspec's configuration or from
``storage_options`` (a secret field: never written into a checkpoint, a log or a tracker).

Test hooks (see :mod:`.commit`): ``TRAINWELL_TEST_KILL_AT=upload:<step>:0`` SIGKILLs the process after the first
object of ``checkpoint-<step>`` is uploaded, ``published:<step>:0`` after every object but the marker,
``rotate:<step>:0`` in the deletion of ``checkpoint-<step>`` after its marker is gone, before its objects.

This module imports neither torch nor numpy; fsspec is imported when a store is used.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from ..utils.checkpoint_names import is_checkpoint_name
from . import layout
from .layout import COMPLETE_MARKER, TMP_PREFIX, CheckpointError
from .lock import OutputDirLockedError
from .store_calls import endpoint_of

logger = logging.getLogger(__name__)

UPLOADING = ".uploading"
DELETING = ".deleting"
LOCK_OBJECT = ".trainwell-lock.json"
# read at each use (a test of many processes sets them in its child script): the lease thread refreshes the lock and
# every upload in progress this often, whatever the uploads do; a lock or an upload whose heartbeat is older than
# STALE_S is taken as gone (its run is dead) and may be taken over / removed
HEARTBEAT_S = 30.0
STALE_S = 120.0
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


class StoreLockLostError(CheckpointError):
    """Another run holds the store's lock this run held: this run publishes and deletes nothing more there."""


class CheckpointStore:
    """The checkpoints under one fsspec URL: publish (upload), list the complete ones, download, delete, lock.

    ``owner`` is the lock owner this instance acts for once :meth:`acquire_lock` succeeded (None: no lock, another
    node's uploader); ``lost`` is kept once the lock was found taken over (every later destructive act raises it)."""

    def __init__(self, url: str, storage_options: Any = None) -> None:
        try:
            import fsspec
        except ImportError as err:
            raise ImportError(f"checkpoint_store={url!r} needs fsspec: pip install 'trainwell[store]' and the file "
                              "system of the URL (s3fs for s3://, gcsfs for gs://, adlfs for az://)") from err

        self.url = url.rstrip("/")
        options = parse_storage_options(storage_options)
        self.endpoint = endpoint_of(options)  # named in the errors (the options are secret; the endpoint is not)
        self.fs, root = fsspec.core.url_to_fs(self.url, **options)
        self.root = str(root).rstrip("/")
        self.owner: str | None = None
        self.lost: StoreLockLostError | None = None
        self._active: dict[str, dict[str, Any]] = {}  # this process's uploads in progress: name -> .uploading record
        self._guard = threading.Lock()  # a heartbeat rewrites .uploading only while its upload is still in progress

    def _key(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _names(self) -> list[str]:
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        return [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]

    def _objects(self, name: str) -> dict[str, dict[str, Any]]:
        """``{relative key: info}`` of every object under ``<url>/<name>/``."""
        prefix = self._key(name)
        try:
            found = self.fs.find(prefix, detail=True)
        except FileNotFoundError:
            return {}
        start = len(prefix.lstrip("/")) + 1
        return {str(key).lstrip("/")[start:]: info for key, info in found.items()
                if info.get("type", "file") != "directory"}

    def _sizes(self, name: str) -> dict[str, int]:
        """``{relative key: size}`` of every object under ``<url>/<name>/``."""
        return {rel: int(info.get("size") or 0) for rel, info in self._objects(name).items()}

    def _raw_marker(self, name: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self.fs.cat_file(self._key(name, COMPLETE_MARKER)))
        except (FileNotFoundError, ValueError):
            return None
        return record if layout._is_marker_record(record) else None

    def read_marker(self, name: str) -> dict[str, Any] | None:
        """The marker record of ``<url>/<name>`` as the local marker has it (without the objects' fingerprints), or
        None when it has none (or an unreadable one)."""
        record = self._raw_marker(name)
        if record is not None:
            record.pop("objects", None)
        return record

    def _read_json(self, name: str, obj: str) -> dict[str, Any] | None:
        try:
            record = json.loads(self.fs.cat_file(self._key(name, obj)))
        except (FileNotFoundError, ValueError):
            return None
        return record if isinstance(record, dict) else None

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
        self.check_lock()  # nothing replaced on a store another run holds now
        if nodes == 1:
            self._refuse_live_upload(name)
        if self.read_marker(name) is not None:  # an earlier run's checkpoint of this step: invisible first
            self.fs.rm_file(self._key(name, COMPLETE_MARKER))
        if nodes == 1 and self._sizes(name):  # its objects, or an interrupted upload's (other nodes: kept)
            self.fs.rm(self._key(name), recursive=True)
        mark = {"run": run, "owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(),
                "heartbeat": time.time()}
        with self._guard:
            self._active[name] = mark
            self.fs.pipe_file(self._key(name, UPLOADING), json.dumps(mark).encode())
        try:
            total = self._upload_files(folder, name, record, step=step, node=node, nodes=nodes, wait_s=wait_s,
                                       test_hook=test_hook)
        finally:
            with self._guard:
                self._active.pop(name, None)
        return total

    def _upload_files(self, folder: Path, name: str, record: dict[str, Any], *, step: int | None, node: int,
                      nodes: int, wait_s: float, test_hook: Any) -> int:
        files = dict(record["files"])
        if nodes > 1:
            self.fs.pipe_file(self._key(name, f".node-{node}.json"), json.dumps(files).encode())
            if node != 0:
                first = self._wait_for(name, ".node-0.json", wait_s, "node 0 did not list its files")
                files = {rel: entry for rel, entry in files.items() if rel not in first}
        total = 0
        for index, (rel, entry) in enumerate(sorted(files.items())):
            if self.lost is not None:  # found taken over by the lease thread: not one more object
                raise self.lost
            self.fs.put_file(str(folder / rel), self._key(name, rel))
            total += int(entry["size"])
            if index == 0:
                test_hook("upload", step if step is not None else -1, node)
        tags = self._check_sizes(name, files)
        if nodes > 1 and node != 0:
            self.fs.pipe_file(self._key(name, f".node-{node}.done"), b"{}")
            return total
        if nodes > 1:
            for other in range(1, nodes):
                self._wait_for(name, f".node-{other}.done", wait_s, f"node {other} did not report its upload")
                extra = self._wait_for(name, f".node-{other}.json", wait_s, f"node {other} did not list its files")
                files.update({rel: entry for rel, entry in extra.items() if rel not in files})
            record = {**record, "files": files}
            tags = self._check_sizes(name, files)
        test_hook("published", step if step is not None else -1, node)
        self.check_lock()  # the marker certifies these objects only while no other run may have written them
        marker = {**record, "objects": tags}
        self.fs.pipe_file(self._key(name, COMPLETE_MARKER), json.dumps(marker, indent=1, sort_keys=True).encode())
        for other in range(nodes if nodes > 1 else 0):
            for suffix in ("json", "done"):
                if self.fs.exists(self._key(name, f".node-{other}.{suffix}")):
                    self.fs.rm_file(self._key(name, f".node-{other}.{suffix}"))
        with self._guard:
            self._active.pop(name, None)
            self.fs.rm_file(self._key(name, UPLOADING))
        return total

    def _check_sizes(self, name: str, files: dict[str, Any]) -> dict[str, str]:
        """Check every object's size on the store; returns their fingerprints (:func:`_fingerprint`)."""
        self.fs.invalidate_cache()
        objects = self._objects(name)
        for rel, entry in files.items():
            size = objects[rel].get("size") if rel in objects else None
            if size != entry["size"]:
                raise CheckpointError(f"{self.url}/{name}/{rel}: {size} bytes on the store after the "
                                      f"upload, {entry['size']} written locally")
        return {rel: _fingerprint(objects[rel]) for rel in files}

    def _refuse_live_upload(self, name: str) -> None:
        """Raise when ``<url>/<name>`` is another live run's upload in progress (never replaced under it)."""
        mark = self._read_json(name, UPLOADING)
        if mark is not None and self._live_elsewhere(name, mark):
            raise CheckpointError(
                f"{self.url}/{name} is being uploaded by another live run (owner {mark.get('owner')}, pid "
                f"{mark.get('pid')} on host {mark.get('host')}, heartbeat {time.time() - _heartbeat(mark):.0f} s ago); "
                "its objects are not replaced: two runs write to one checkpoint_store")

    def _live_elsewhere(self, name: str, mark: dict[str, Any]) -> bool:
        """Whether the ``.uploading`` record ``mark`` of ``name`` is an upload in progress: this process's, or
        another's whose heartbeat is younger than ``STALE_S`` (and whose process is not known dead)."""
        if name in self._active:
            return True
        if mark.get("host") == socket.gethostname() and isinstance(mark.get("pid"), int):
            if mark["pid"] == os.getpid() or not layout.pid_alive(mark["pid"]):
                return False  # this process's upload that ended (failed), or a dead process's
        return time.time() - _heartbeat(mark) <= STALE_S

    def touch_uploads(self) -> None:
        """Refresh the heartbeat of this process's uploads in progress (the lease thread, every ``HEARTBEAT_S``)."""
        with self._guard:
            for name, mark in list(self._active.items()):
                mark["heartbeat"] = time.time()
                self.fs.pipe_file(self._key(name, UPLOADING), json.dumps(mark).encode())

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
    def _scan(self) -> list[tuple[int, str, dict[str, Any] | None, dict[str, dict[str, Any]]]]:
        """``(step, name, raw marker or None, objects)`` of every ``checkpoint-<step>`` prefix on the store."""
        found = []
        for name in self._names():
            step = is_checkpoint_name(name)
            if step is not None:
                found.append((step, name, self._raw_marker(name), self._objects(name)))
        return found

    def complete(self, scan: list[Any] | None = None) -> list[tuple[str, dict[str, Any]]]:
        """``(name, marker record)`` of every complete checkpoint on the store, oldest first (run by run as
        :func:`layout.order_by_run` orders local folders, by step within a run): its marker is there, no deletion
        began, and every object it lists has the recorded size and the fingerprint the upload recorded."""
        found = []
        for step, name, raw, objects in self._scan() if scan is None else scan:
            if raw is None or DELETING in objects:
                continue
            tags = raw.pop("objects", None) or {}
            if all(rel in objects and int(objects[rel].get("size") or 0) == entry["size"]
                   and (rel not in tags or _fingerprint(objects[rel]) == tags[rel])
                   for rel, entry in raw["files"].items()):
                found.append((step, name, raw))
        last: dict[Any, float] = {}
        for _, _, record in found:
            last[record.get("run")] = max(float(record.get("created", 0)), last.get(record.get("run"), 0.0))
        found.sort(key=lambda item: (last[item[2].get("run")], item[0]))
        return [(name, record) for _, name, record in found]

    def unfinished(self, scan: list[Any] | None = None) -> list[str]:
        """Names of trainwell's unfinished uploads (an ``.uploading`` object and no marker) and interrupted deletions
        (a ``.deleting`` object), live or not."""
        return [name for _, name, raw, objects in (self._scan() if scan is None else scan)
                if DELETING in objects or (UPLOADING in objects and raw is None)]

    def remove_unfinished(self, scan: list[Any] | None = None) -> list[str]:
        """Delete trainwell's interrupted uploads and deletions (call with the store's lock held; each removal reads
        it first); an upload in progress (its heartbeat younger than ``STALE_S``) is never touched. Returns the
        names removed."""
        removed = []
        for name in self.unfinished(scan):
            if not self.fs.exists(self._key(name, DELETING)):
                mark = self._read_json(name, UPLOADING) or {}
                if self._live_elsewhere(name, mark):
                    logger.info("%s/%s is being uploaded by a live run (owner %s, host %s): kept", self.url, name,
                                mark.get("owner"), mark.get("host"))
                    continue
            self.check_lock()
            self._remove(name)
            removed.append(name)
        if removed:
            logger.warning("removed interrupted checkpoint uploads or deletions from %s: %s", self.url, removed)
        return removed

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
        """Delete trainwell's checkpoint ``name`` from the store (:meth:`_remove`); nothing when it has no marker."""
        if self.read_marker(name) is None:
            return
        self.check_lock()
        self._remove(name)

    def _remove(self, name: str) -> None:
        """``.deleting`` first (a deletion a kill interrupts is finished by the next start or rotation), then the
        marker (never a half-deleted checkpoint that looks complete), every object, and ``.deleting`` last."""
        from .commit import test_hook  # .commit loads torch: this module imports neither torch nor numpy

        self.fs.pipe_file(self._key(name, DELETING), json.dumps(
            {"owner": self.owner, "host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}).encode())
        if self.fs.exists(self._key(name, COMPLETE_MARKER)):
            self.fs.rm_file(self._key(name, COMPLETE_MARKER))
        step = is_checkpoint_name(name)
        test_hook("rotate", step if step is not None else -1, 0)
        self.fs.invalidate_cache()
        rest = [self._key(name, rel) for rel in self._objects(name) if rel != DELETING]
        if rest:
            self.fs.rm(rest)
        self.fs.rm_file(self._key(name, DELETING))
        self.fs.invalidate_cache()
        if self.fs.exists(self._key(name)):  # a file system with directories (memory://, local): the empty one
            self.fs.rm(self._key(name), recursive=True)

    def rotate(self, limit: int | None, *, keep: set[str], current_run: str | None) -> list[str]:
        """Finish interrupted deletions and remove dead uploads (:meth:`remove_unfinished`), then delete the oldest
        complete checkpoints beyond ``limit``: never the newest nor those of ``keep`` (the best, the one just saved);
        another run's before ``current_run``'s, as the local rotation. Returns the names of those rotated away."""
        if not limit or limit <= 0:
            return []
        self.check_lock()
        scan = self._scan()
        self.remove_unfinished(scan)
        found = self.complete(scan)
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
        gone = _stale(held) if held is not None and held.get("owner") != owner else None
        if held is not None and held.get("owner") != owner and gone is None:
            raise OutputDirLockedError(
                f"checkpoint_store {self.url} is in use by another run (pid {held.get('pid')} on host "
                f"{held.get('host')}, last heartbeat {time.time() - _heartbeat(held):.0f} s ago); "
                f"wait for it to end, use another URL, or delete {self.url}/{LOCK_OBJECT} once that run is known to "
                f"be over (a lock without a heartbeat for {STALE_S:.0f} s is taken over)")
        if gone is not None and held is not None:  # as the output_dir lock says it (lock.py)
            logger.warning("taking over the lock %s/%s left by pid %s on host %s, %s", self.url, LOCK_OBJECT,
                           held.get("pid", "?"), held.get("host", "?"), gone)
        self.heartbeat(owner)
        again = self._read_lock()
        if again is None or again.get("owner") != owner:  # another run wrote at the same moment: it wins
            raise OutputDirLockedError(f"checkpoint_store {self.url} was locked by another run starting at the same "
                                       "moment; use another URL or retry once it ends")
        self.owner, self.lost = owner, None

    def heartbeat(self, owner: str) -> None:
        """Write (refresh) the lock object of ``owner``."""
        record = {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": time.time()}
        self.fs.pipe_file(self._key(LOCK_OBJECT), json.dumps(record).encode())

    def check_lock(self) -> None:
        """Before every destructive act and every heartbeat: raise :class:`StoreLockLostError` (kept in ``lost``,
        logged once) when another run holds the lock this instance took; a lock deleted meanwhile is written again
        (no other run holds it). Nothing without a lock (``owner`` None)."""
        if self.lost is not None:
            raise self.lost
        if self.owner is None:
            return
        held = self._read_lock()
        if held is None:
            logger.warning("the lock %s/%s of this live run was deleted; writing it again", self.url, LOCK_OBJECT)
            self.heartbeat(self.owner)
            return
        if held.get("owner") != self.owner:
            self.lost = StoreLockLostError(
                f"checkpoint_store {self.url}: the lock of this run was taken over by another run (pid "
                f"{held.get('pid')} on host {held.get('host')}, heartbeat {time.time() - _heartbeat(held):.0f} s "
                "ago): two runs write to one store. This run publishes and deletes nothing more there (its "
                "checkpoints stay complete in the local output_dir); stop one of the runs, or give each its own URL")
            logger.error("%s", self.lost)
            raise self.lost

    def keep_alive(self) -> None:
        """One beat of the lease: check the lock is still this run's, refresh it and the uploads in progress."""
        self.check_lock()
        if self.owner is not None:
            self.heartbeat(self.owner)
        self.touch_uploads()

    def release_lock(self, owner: str) -> None:
        """Delete the lock object when ``owner`` holds it."""
        held = self._read_lock()
        if held is not None and held.get("owner") == owner:
            self.fs.rm_file(self._key(LOCK_OBJECT))
        if self.owner == owner:
            self.owner = None


def _heartbeat(record: dict[str, Any]) -> float:
    try:
        return float(record.get("heartbeat", 0))
    except (TypeError, ValueError):
        return 0.0


def _fingerprint(info: dict[str, Any]) -> str:
    """What identifies one written version of an object: the store's ETag (a checksum of its bytes on S3) where it
    has one, else its modification time; an object another writer replaced, even with as many bytes, differs."""
    for key in ("ETag", "etag", "md5Hash", "LastModified", "last_modified", "mtime", "created"):
        if info.get(key) is not None:
            return str(info[key])
    return ""


def _stale(record: dict[str, Any]) -> str | None:
    """Why a lock record's run is gone (its process is dead on this host, or its heartbeat is too old), or None
    while it may live."""
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        if not layout.pid_alive(record["pid"]):
            return "which is no longer running"
    age = time.time() - _heartbeat(record)
    if age > STALE_S:
        return f"whose last heartbeat is {age:.0f} s old (a lock without one for {STALE_S:.0f} s is taken over)"
    return None


__all__ = ["CheckpointStore", "DELETING", "LOCK_OBJECT", "StoreLockLostError", "UPLOADING", "is_store_url",
           "parse_storage_options"]
