"""The Trainer's ``checkpoint_store`` part: lock, download for a resume, background publish, rotation on the store.

``output_dir`` stays the local folder everything is committed into first (see :mod:`trainwell.checkpoint.store` for
the publish protocol). World process zero holds the store's lock and an uploader for the duration of ``train()``
(with one disk per node, every other node's saver gets an uploader of its own at its first save); the saving rank(s)
download the checkpoint to resume when ``output_dir`` lacks it.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
        self._owner: str | None = None

    @classmethod
    def from_args(cls, args: Any) -> StoreSync | None:
        """The part for ``args.checkpoint_store`` (None without one)."""
        url = getattr(args, "checkpoint_store", None)
        if not url:
            return None
        from ...checkpoint.store import CheckpointStore

        return cls(CheckpointStore(url, getattr(args, "storage_options", None)), args.save_total_limit)

    def lock(self) -> None:
        """World process zero: take the store's lock, remove interrupted uploads, start the uploader."""
        if self.uploader is not None:
            return
        from ...checkpoint.store_upload import StoreUploader

        owner = uuid.uuid4().hex
        self.store.acquire_lock(owner)
        self._owner = owner
        self.store.remove_unfinished()  # dead uploads, interrupted deletions; never a live upload
        self.uploader = StoreUploader(self.store)  # its lease keeps the lock's heartbeat, whatever the uploads do
        self.stats = self.uploader.stats

    def close(self) -> None:
        """Wait for the last uploads (a failure is logged: train() is leaving already), release the lock."""
        uploader, self.uploader = self.uploader, None
        if uploader is not None:
            uploader.close()
        owner, self._owner = self._owner, None
        if owner is not None:
            try:
                self.store.release_lock(owner)
            except Exception as err:  # without its heartbeat the lock goes stale by itself
                logger.warning("could not release the lock of %s (%s)", self.store.url, err)

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

    def fetch(self, resume_from_checkpoint: str | bool | None, output_dir: str) -> Path | None:
        """A resume (``True`` or ``"auto"``): download the store's newest complete checkpoint into ``output_dir``
        (every checksum verified; a damaged one falls back to the one before), and the best one it names; a copy
        already in ``output_dir`` is kept. Returns the newest one's local folder (None: nothing on the store)."""
        from ...checkpoint.layout import CheckpointError

        auto = isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() == "auto"
        if not (resume_from_checkpoint is True or auto):
            return None
        found = self.store.complete()
        for name, _ in reversed(found):
            try:
                folder = self.store.download(name, output_dir)
            except (CheckpointError, OSError) as err:
                logger.error("checkpoint %s/%s cannot be used (%s); trying the one before", self.store.url, name,
                             err)
                continue
            logger.warning("checkpoint_store: %s/%s is in %s", self.store.url, name, folder)
            best = best_named_in(folder)
            if best is not None and best != name and best in {n for n, _ in found}:
                self.store.download(best, output_dir)
            return folder
        return None


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


__all__ = ["StoreSync", "best_named_in", "local_best"]
