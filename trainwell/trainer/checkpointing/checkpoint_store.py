"""The Trainer's ``checkpoint_store`` part: lock, download for a resume, background publish, rotation on the store.

``output_dir`` stays the local folder everything is committed into first (see :mod:`trainwell.checkpoint.store` for
the publish protocol). World process zero holds the store's lock and an uploader for the duration of ``train()``
(with one disk per node, every other node's saver gets an uploader of its own at its first save); the saving rank(s)
download the checkpoint to resume when ``output_dir`` lacks it.

Every call to the store made here runs on the training thread, so each goes through
:func:`trainwell.checkpoint.store_calls.call`: a deadline (``TRAINWELL_STORE_TIMEOUT_S``), a line on stderr while
it waits, and a clear error naming the URL, the cause and the fix; the lock's release at the end is best effort.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar


T = TypeVar("T")

if TYPE_CHECKING:  # imported where used: a run without a store loads neither fsspec nor the uploader
    from ...checkpoint.store import CheckpointStore
    from ...checkpoint.store_upload import StoreUploader, UploadStats

logger = logging.getLogger("trainwell.trainer.trainer")


class StoreSync:
    """The store of one Trainer's arguments and, while ``train()`` runs on world process zero, its uploader."""

    def __init__(self, store: CheckpointStore, save_total_limit: int | None) -> None:
        self.store, self.save_total_limit = store, save_total_limit
        self.uploader: StoreUploader | None = None
        self.stats: UploadStats | None = None  # the last train() call's uploads (kept after it returns)
        self.downloaded: dict[str, str] = {}  # local folder name -> the store URL it was downloaded from
        self._owner: str | None = None

    @classmethod
    def from_args(cls, args: Any) -> StoreSync | None:
        """The part for ``args.checkpoint_store`` (None without one)."""
        url = getattr(args, "checkpoint_store", None)
        if not url:
            return None
        from ...checkpoint.store import CheckpointStore

        return cls(CheckpointStore(url, getattr(args, "storage_options", None)), args.save_total_limit)

    def _call(self, what: str, fn: Callable[..., T], *args: Any, moves: int = 0) -> T:
        """``fn(*args)``, a call to the store, within its deadline and with a clear error (:mod:`.store_calls`)."""
        from ...checkpoint import store_calls  # a run without a store never imports it (nor layout, lock)

        return store_calls.call(self.store.url, what, fn, *args, moves=moves, endpoint=self.store.endpoint)

    def lock(self) -> None:
        """World process zero: take the store's lock, remove interrupted uploads, start the uploader."""
        if self.uploader is not None:
            return
        from ...checkpoint.store_upload import StoreUploader

        owner = uuid.uuid4().hex
        self._call("taking the store's lock", self.store.acquire_lock, owner)
        self._owner = owner
        # dead uploads, interrupted deletions; never a live upload
        self._call("removing interrupted uploads", self.store.remove_unfinished)
        self.uploader = StoreUploader(self.store)  # its lease keeps the lock's heartbeat, whatever the uploads do
        self.stats = self.uploader.stats

    def close(self) -> None:
        """Wait for the last uploads (a failure is logged: train() is leaving already), release the lock (best
        effort, within a short deadline: once its lease stops, the lock goes stale by itself)."""
        uploader, self.uploader = self.uploader, None
        if uploader is not None:
            uploader.close()
        owner, self._owner = self._owner, None
        if owner is not None:
            from ...checkpoint import store_calls

            store_calls.best_effort(self.store.url, "releasing the store's lock", self.store.release_lock, owner,
                                    endpoint=self.store.endpoint, log=lambda fmt, *a: logger.warning(
                                        "could not release the lock (it goes stale by itself): " + fmt, *a))

    def wait(self) -> None:
        """Block until every upload is published (the end of ``train()``); raise a failed one naming it."""
        if self.uploader is None:
            return
        self.uploader.wait()
        stats = self.uploader.stats
        logger.info("checkpoint_store %s: %d checkpoint(s), %.1f MB uploaded in %.2f s in the background; the "
                    "training thread waited %.3f s for the store", self.store.url, stats.uploaded, stats.bytes / 1e6,
                    stats.upload_s, stats.blocked_s)

    def uploading(self) -> tuple[Path, ...]:
        """The local checkpoints queued or uploading now (the local rotation keeps them)."""
        return self.uploader.pending() if self.uploader is not None else ()

    def publish(self, folder: Path, best: str | None, *, run: str | None, saves: bool, node: int = 0,
                nodes: int = 1, then: Callable[[], object] | None = None) -> bool:
        """Queue the upload of the committed ``folder``, then ``then()`` (the local rotation) and, on world process
        zero, the store's rotation. ``saves``: whether this rank wrote ``folder``; ``nodes > 1``: one disk per node,
        this rank is node ``node``'s saver (see :meth:`CheckpointStore.upload`). False when nothing is queued here
        (the caller rotates itself)."""
        if self.uploader is None and saves and nodes > 1:  # another node's saver: its own uploader, no lock
            from ...checkpoint.store_upload import StoreUploader

            self.uploader = StoreUploader(self.store)
            self.stats = self.uploader.stats
        uploader, store, limit = self.uploader, self.store, self.save_total_limit
        if uploader is None or not saves:
            return False
        keep = {folder.name} | ({Path(best).name} if best else set())
        owner = self._owner

        def rotate() -> None:
            if then is not None:
                then()
            if owner is not None:  # world process zero's (it holds the lock): the store's rotation
                store.rotate(limit, keep=keep, current_run=run)

        uploader.submit(folder, run=run, rotate=rotate, node=node, nodes=nodes)
        return True

    def resolve(self, args: Any, output_dir: str, resume_from_checkpoint: str | bool | None, *,
                trial: bool = False) -> str | bool | None:
        """Every rank, at the start of ``train()``: what the resume argument means with the store
        (:meth:`resume_for`; rank 0's answer on every rank) and the saving ranks' download of the checkpoint to
        resume when ``output_dir`` lacks it (:meth:`fetch`). Returns the resume argument to use. A hyper-parameter
        search's ``trial`` (each in its own empty ``output_dir``, one store) never takes None as a resume."""
        self.downloaded = {}
        if args.should_save and not trial:
            resume_from_checkpoint = self.resume_for(resume_from_checkpoint, output_dir,
                                                     overwrite=bool(args.overwrite_output_dir))
        if args.world_size > 1:
            from ...runtime.distributed import all_gather_object, is_dist

            if is_dist():
                resume_from_checkpoint = all_gather_object(resume_from_checkpoint)[0]
        if args.should_save:
            self.fetch(resume_from_checkpoint, output_dir)
        return resume_from_checkpoint

    def source_of(self, folder: Path) -> str | None:
        """The store URL ``folder`` was downloaded from by this run's start, or None (it was on the local disk)."""
        return self.downloaded.get(Path(folder).name)

    def start(self, args: Any, output_dir: str, folder: Path | None, run: str | None) -> None:
        """World process zero, the store's lock held, once the run knows where it starts: a fresh run warns about
        (or, with ``overwrite_output_dir``, deletes) the store's earlier checkpoints as about ``output_dir``'s
        (:meth:`claim`); a resume publishes its checkpoint when the store lacks it (:meth:`catch_up`), or, with one
        disk per node (whose local marker lists one node's files), says loudly that it exists on these machines
        only."""
        if self._owner is None:
            return
        if folder is None:
            self.claim(args, output_dir)
        elif not getattr(args, "save_on_each_node", False):
            self.catch_up(folder, run)
        elif self._call(f"reading {folder.name}'s marker", self.store.read_marker, folder.name) is None:
            logger.warning("checkpoint_store %s lacks %s, the checkpoint this run resumes from; with "
                           "save_on_each_node it is not published again: it exists on these machines only",
                           self.store.url, folder.name)

    def resume_for(self, resume_from_checkpoint: str | bool | None, output_dir: str, *,
                   overwrite: bool) -> str | bool | None:
        """What ``resume_from_checkpoint`` means with this store. None (what ``get_last_checkpoint(output_dir)``
        returns on an empty folder) on an ``output_dir`` holding no checkpoint while the store holds complete ones
        is a requeue on a fresh machine: True (the store's newest), said loudly. ``False`` (an explicit fresh run)
        and ``overwrite_output_dir=True`` keep their meaning; so does None on an ``output_dir`` holding checkpoints
        (a fresh run after a finished one, as without a store)."""
        from ...checkpoint.layout import list_resumable_checkpoints

        if resume_from_checkpoint is not None or overwrite or list_resumable_checkpoints(output_dir):
            return resume_from_checkpoint
        found = self._call("listing its checkpoints", self.store.complete)
        if not found:
            return None
        logger.warning("output_dir %s holds no checkpoint and checkpoint_store %s holds %s: resuming from the store's "
                       "newest, %s (a requeue on a fresh machine: get_last_checkpoint(output_dir) reads only the "
                       "local folder, so it gave None). To start a fresh run on this prefix instead, pass "
                       "train(resume_from_checkpoint=False) (it supersedes those checkpoints, as in a used "
                       "output_dir), overwrite_output_dir=True (deletes them) or another checkpoint_store.",
                       output_dir, self.store.url, _names([name for name, _ in found]), found[-1][0])
        return True

    def fetch(self, resume_from_checkpoint: str | bool | None, output_dir: str) -> Path | None:
        """A resume (``True`` or ``"auto"``): download the store's newest complete checkpoint into ``output_dir``
        (every checksum verified; a damaged one falls back to the one before), and the best one it names, unless
        ``output_dir`` holds a checkpoint as new or newer (a store left behind by an outage: that one is resumed,
        and published by :meth:`catch_up`). A path ``output_dir/checkpoint-<step>`` that ``output_dir`` lacks is
        downloaded from the store. Returns the local folder to resume (None: nothing on the store)."""
        from ...checkpoint.layout import CheckpointError

        auto = isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() == "auto"
        if isinstance(resume_from_checkpoint, (str, os.PathLike)) and not auto:
            path = Path(resume_from_checkpoint)
            if path.exists() or path.parent.resolve() != Path(output_dir).resolve() \
                    or self._call(f"reading {path.name}'s marker", self.store.read_marker, path.name) is None:
                return None
            found = self._call("listing its checkpoints", self.store.complete)
            return self._download(path.name, output_dir, found, "resume_from_checkpoint names it")
        if not (resume_from_checkpoint is True or auto):
            return None
        from ...checkpoint.store_calls import StoreAccessError

        found = self._call("listing its checkpoints", self.store.complete)
        local = newest_local(output_dir, found)
        if local is not None:
            return local
        for name, _ in reversed(found):
            try:
                return self._download(name, output_dir, found, "the store's newest")
            except StoreAccessError:  # the store, not this checkpoint: the one before would fail alike
                raise
            except (CheckpointError, OSError) as err:
                logger.error("checkpoint %s/%s cannot be used (%s); trying the one before", self.store.url, name,
                             err)
        return None

    def _download(self, name: str, output_dir: str, found: list[tuple[str, dict[str, Any]]], why: str) -> Path:
        """Download ``name`` and the best checkpoint it names (when the store holds it); each download's deadline
        grows with its bytes."""
        sizes = {n: sum(int(entry.get("size", 0)) for entry in record.get("files", {}).values()) for n, record in found}
        folder = self._call(f"downloading {name}", self.store.download, name, output_dir, moves=sizes.get(name, 0))
        self.downloaded[Path(folder).name] = f"{self.store.url}/{name}"
        logger.warning("checkpoint_store: %s/%s (%s) is in %s", self.store.url, name, why, folder)
        best = best_named_in(folder)
        if best is not None and best != name and best in sizes:
            self._call(f"downloading {best}", self.store.download, best, output_dir, moves=sizes[best])
        return folder

    def catch_up(self, folder: Path, run: str | None) -> bool:
        """World process zero, the lock held, at the start of a resume from the local ``folder``: publish it when
        the store lacks it (a store left behind by an outage), saying so. True when queued."""
        from ...checkpoint.layout import CheckpointError, is_complete, read_marker

        if self.uploader is None or not is_complete(folder):
            return False
        stored = self._call(f"reading {folder.name}'s marker", self.store.read_marker, folder.name)
        try:
            if stored == read_marker(folder):
                return False
        except CheckpointError:
            return False
        found = self._call("listing its checkpoints", self.store.complete)
        logger.warning("checkpoint_store %s lacks %s, the checkpoint this run resumes from (the store's newest is "
                       "%s: its uploads stopped, e.g. an outage); publishing it now", self.store.url, folder.name,
                       found[-1][0] if found else "none")
        self.uploader.submit(folder, run=run)
        return True

    def claim(self, args: Any, output_dir: str) -> None:
        """World process zero, the lock held, at the start of a fresh run: the rule of ``output_dir``
        (:mod:`.output_dir_runs`) for the store's checkpoints that ``output_dir`` lacks: a warning naming them (this
        run supersedes them: the store's rotation deletes them first), or with ``overwrite_output_dir=True`` their
        deletion."""
        from ...checkpoint.layout import CheckpointError, is_complete, read_marker

        if self._owner is None:
            return
        earlier = []
        for name, record in self._call("listing its checkpoints", self.store.complete):
            local = Path(output_dir) / name
            try:
                if is_complete(local) and read_marker(local) == record:
                    continue  # named by output_dir's own warning
            except CheckpointError:
                pass
            earlier.append(name)
        if not earlier:
            return
        url = self.store.url
        writes_checkpoints = args.save_strategy != "no" or getattr(args, "enable_jit_checkpoint", False)
        if writes_checkpoints and args.overwrite_output_dir:
            for name in earlier:
                self._call(f"deleting {name}", self.store.delete, name)
            logger.warning("overwrite_output_dir=True: deleted the earlier run's checkpoints in checkpoint_store %s "
                           "(%s); this run starts over", url, _names(earlier))
        elif writes_checkpoints:
            logger.warning("checkpoint_store %s holds an earlier run's checkpoints (%s): this fresh run supersedes "
                           "them (as in a used output_dir). Its checkpoints count as newer than those whatever their "
                           "steps: save_total_limit rotates the earlier ones away first, a save of the same step "
                           "replaces that checkpoint, and resume_from_checkpoint=True takes this run's newest. To "
                           "continue that run instead, use train(resume_from_checkpoint=True).", url, _names(earlier))
        else:
            logger.warning("checkpoint_store %s holds another run's checkpoints (%s); this run saves none. Continue "
                           "that run with train(resume_from_checkpoint=True).", url, _names(earlier))


def _names(names: list[str]) -> str:
    return ", ".join(names if len(names) <= 3 else ["...", *names[-3:]])


def newest_local(output_dir: str, found: list[tuple[str, dict[str, Any]]]) -> Path | None:
    """``output_dir``'s newest complete checkpoint when it is as new as or newer than every one of the store's
    ``found`` (run by run, by step within a run, as :func:`trainwell.checkpoint.layout.order_by_run`), else None."""
    from ...checkpoint.layout import CheckpointError, list_complete_checkpoints, read_marker
    from ...utils.checkpoint_names import is_checkpoint_name

    entries: list[tuple[Any, float, int, bool, Path | None]] = []
    for path in list_complete_checkpoints(output_dir):
        try:
            record = read_marker(path)
        except CheckpointError:
            continue
        entries.append((record.get("run"), float(record.get("created", 0)), is_checkpoint_name(path.name) or 0,
                        True, path))
    if not entries:
        return None
    for name, record in found:
        entries.append((record.get("run"), float(record.get("created", 0)), is_checkpoint_name(name) or 0, False,
                        None))
    last: dict[Any, float] = {}
    for run, created, _, _, _ in entries:
        last[run] = max(created, last.get(run, created))
    newest = max(entries, key=lambda e: (last[e[0]], e[2], e[3]))  # a tie: the local copy
    return newest[4]


def best_named_in(folder: Path) -> str | None:
    """The folder name of the best checkpoint recorded in ``folder``'s trainer state (None when none)."""
    try:
        best = json.loads((folder / "trainer_state.json").read_text())["best_model_checkpoint"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(best).name if isinstance(best, str) and best else None


def local_best(best: str | None, output_dir: str) -> str | None:
    """``best`` (a best checkpoint's path recorded on another machine or in another ``output_dir``: a download from
    the store) as the same-named folder of ``output_dir`` when that one exists."""
    if best and Path(best).parent.resolve() != Path(output_dir).resolve() \
            and (Path(output_dir) / Path(best).name).is_dir():
        return str(Path(output_dir) / Path(best).name)
    return best


__all__ = ["StoreSync", "best_named_in", "local_best", "newest_local"]
