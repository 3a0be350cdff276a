"""The locks a ``train()`` takes before it touches ``output_dir`` (and the object store), and the word it gives at
the start about folders it will not touch. Imported when ``train()`` starts, not with the Trainer."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...checkpoint.layout import list_foreign_checkpoints
from ...checkpoint.lock import OutputDirLock, OutputDirLockedError
from ...runtime.distributed import all_gather_object, is_dist

if TYPE_CHECKING:
    from .checkpoint_store import StoreSync

logger = logging.getLogger(__name__)


def lock_output_dir(args: Any, store: StoreSync | None, held: OutputDirLock | None) -> OutputDirLock | None:
    """World process zero takes the ``output_dir`` lock (unless it holds it: ``held``), then the store's; with
    several processes every rank learns the outcome (one gather of a short string), so all of them fail together
    instead of waiting for rank 0. Returns the ``output_dir`` lock held (None on the other ranks)."""
    error: Exception | None = None
    taken: OutputDirLock | None = None
    if args.process_index == 0 and held is None and args.output_dir:
        lock = OutputDirLock(args.output_dir)
        try:
            lock.acquire()
            held = taken = lock
        except OutputDirLockedError as err:
            error = err
        except OSError as err:  # a read-only output_dir: nothing of this run can collide there
            logger.warning("Could not lock output_dir %s (%s); training without the lock, so make sure no other "
                           "trainer uses this folder", args.output_dir, err)
        if error is None and store is not None:
            try:
                store.lock()
            except Exception as err:  # held by another run, or out of reach: every rank fails with it, now
                error = err
    if args.world_size > 1:
        if is_dist():
            message = all_gather_object(str(error) if error is not None else None)[0]
            if message is not None and error is None:
                error = OutputDirLockedError(f"(reported by rank 0) {message}")
    if error is not None:
        if taken is not None:  # the store failed after the folder's lock was taken here: not left held
            taken.release()
        raise error
    return held


def warn_foreign_checkpoints(args: Any, output_dir: str, resume_from: Path | None) -> None:
    """Foreign checkpoints newer than the start are kept; a save at one of their steps would fail: say so now."""
    if not args.should_save or args.save_strategy == "no":
        return
    start = resume_from.resolve() if resume_from is not None else None
    newer = [p for p in list_foreign_checkpoints(output_dir) if p.resolve() != start]
    if newer:
        logger.warning("output_dir holds checkpoint folders trainwell did not write (no marker): %s. They are "
                       "never deleted nor rotated, and a save at the same step fails instead of replacing them; "
                       "move them elsewhere if this run may reach those steps.", [p.name for p in newer])
