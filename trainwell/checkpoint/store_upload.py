"""The background uploader of ``checkpoint_store``: publishes committed checkpoints off the training thread.

One daemon thread takes the jobs in order (upload ``checkpoint-<step>``, then rotate the store) and retries a failed
job ``retries`` times with a doubling back-off. Another, the lease (:class:`StoreLease`), keeps the heartbeat of the
lock and of every upload in progress every ``store.HEARTBEAT_S``, however long an upload takes, and reads the lock
first: once another run holds it, uploads stop (:class:`~.store.StoreLockLostError`, never retried) and the training
thread gets the error at its next save or at the end of ``train()``. A job that still fails, or that has
not finished by its deadline (``deadline_s`` plus a second per ``MIN_RATE`` bytes of the checkpoint after it started:
a store that stopped answering, whose request can hang far longer than any retry; ``TRAINWELL_STORE_TIMEOUT_S`` sets
``deadline_s``, see :mod:`.store_calls`), is kept as the uploader's error:
the next :meth:`StoreUploader.submit` and :meth:`StoreUploader.wait` (the end of ``train()``) raise it, naming the
checkpoint, so a lost upload never goes unnoticed. :attr:`StoreUploader.stats` holds what the bench reports:
checkpoints and bytes uploaded, seconds spent uploading in the background, and seconds the training thread was
blocked by the store (submitting, and waiting for the last upload at the end). A wait for the last uploads says so on
stderr after a few seconds, and then every half minute (:class:`~.store_calls.WaitReport`).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import store as store_module
from .layout import CheckpointError
from .store import CheckpointStore, StoreLockLostError
from ..utils.progress_bars import above_progress_bars
from .store_calls import TIMEOUT_ENV, StoreTimeoutError, WaitReport, configured_s, seconds
from .store_calls import deadline_s as call_deadline_s

logger = logging.getLogger(__name__)

RETRIES = 3  # a failed upload is tried again this many times,
BACKOFF_S = 1.0  # after 1, 2, 4... seconds
DEADLINE_S = 600.0  # one checkpoint's upload, retries included, may take this long before the run fails by name,
MIN_RATE = 5e6  # plus a second per this many bytes of the checkpoint (a store slower than that is taken as gone)


class StoreLease:
    """A daemon thread that calls ``store.keep_alive()`` every ``store.HEARTBEAT_S``, independent of the uploads;
    it ends once the lock is found taken over (``store.lost``) or at :meth:`stop`."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainwell-store-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(store_module.HEARTBEAT_S):
            try:
                self.store.keep_alive()
            except StoreLockLostError:  # logged by the store; raised to the training thread by the uploader
                return
            except Exception as err:  # a heartbeat lost now is retried at the next one
                logger.warning("could not refresh the lock of %s (%s)", self.store.url, err)

    def stop(self, timeout_s: float = 5.0) -> None:
        """End the thread; waits up to ``timeout_s`` for a beat in progress (one hung on a silent store is left to
        its daemon thread)."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)


@dataclass
class UploadStats:
    """What the uploader did so far."""

    uploaded: int = 0
    bytes: int = 0
    upload_s: float = 0.0
    blocked_s: float = 0.0


class StoreUploader:
    """Uploads checkpoints to ``store`` in a background thread, in the order they were submitted."""

    def __init__(self, store: CheckpointStore, *, retries: int | None = None, backoff_s: float | None = None,
                 deadline_s: float | None = None) -> None:
        self.store = store
        self.retries = RETRIES if retries is None else retries
        self.backoff_s = BACKOFF_S if backoff_s is None else backoff_s
        if deadline_s is None:
            deadline_s = configured_s() or DEADLINE_S  # TRAINWELL_STORE_TIMEOUT_S bounds every wait for the store
        self.deadline_s = deadline_s
        self.stats = UploadStats()
        self.error: CheckpointError | None = None
        self._jobs: queue.Queue[tuple[str, float, Callable[[], None], Callable[[], None]] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._folders: list[Path] = []  # the checkpoints submitted and not uploaded yet (the local rotation keeps them)
        # the job running now, its deadline (time.monotonic()) and the seconds it was allowed
        self._current: tuple[str, float, float] | None = None
        self._thread = threading.Thread(target=self._work, name="trainwell-store-upload", daemon=True)
        self._thread.start()
        self._lease = StoreLease(store)

    def submit(self, folder: Path, *, run: str | None = None, rotate: Callable[[], object] | None = None,
               node: int = 0, nodes: int = 1) -> None:
        """Queue the upload of the committed checkpoint ``folder`` (then ``rotate()``); raises the error of an
        earlier upload that failed."""
        start = time.perf_counter()
        self.raise_if_failed()

        def upload() -> None:
            began = time.perf_counter()
            size = self.store.upload(folder, run=run, node=node, nodes=nodes)
            took = time.perf_counter() - began
            self.stats.uploaded += 1
            self.stats.bytes += size
            self.stats.upload_s += took
            with above_progress_bars():  # this thread's line, drawn above the training thread's bar
                logger.warning("checkpoint_store: uploaded %s to %s/%s (%.1f MB in %.2f s, in the background)",
                               folder.name, self.store.url, folder.name, size / 1e6, took)
            if rotate is not None:
                rotate()

        with self._idle:
            self._pending += 1
            self._folders.append(folder)

        def done() -> None:
            with self._idle:
                self._folders.remove(folder)

        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        self._jobs.put((folder.name, self.deadline_s + size / MIN_RATE, upload, done))
        self.stats.blocked_s += time.perf_counter() - start

    def pending(self) -> tuple[Path, ...]:
        """The checkpoints submitted and not uploaded yet (including the one uploading now)."""
        with self._idle:
            return tuple(self._folders)

    def raise_if_failed(self) -> None:
        """Raise the error of a failed upload, or of one running past its deadline (once kept, it stays)."""
        current = self._current
        if self.error is None and self.store.lost is not None:  # the lease found the lock taken over
            self.error = self.store.lost
        if self.error is None and current is not None and time.monotonic() > current[1]:
            self.error = StoreTimeoutError(
                f"uploading {current[0]} to checkpoint_store {self.store.url} has not finished within its deadline "
                f"of {seconds(current[2])} ({TIMEOUT_ENV} or {DEADLINE_S:.0f} s, plus a second per {MIN_RATE / 1e6:.0f} "
                "MB of the checkpoint): the store stopped answering? The checkpoint is complete in the local "
                "output_dir, but not on the store: a resume elsewhere would not see it")
            logger.error("%s", self.error)
        if self.error is not None:
            raise self.error

    def wait(self) -> None:
        """Block until every submitted upload is done; raise a failed one's error. The time counts as blocked."""
        start = time.perf_counter()
        report = None
        try:
            with self._idle:
                while self._pending:
                    self.raise_if_failed()  # a hung upload: raised by name, not waited for forever
                    if report is None:
                        current = self._current
                        limit = current[1] - time.monotonic() if current is not None else self.deadline_s
                        report = WaitReport(self.store.url, "publishing the last checkpoint(s)", max(0.0, limit))
                    self._idle.wait(timeout=min(store_module.HEARTBEAT_S, max(0.1, self.deadline_s / 4),
                                                report.until_next()))
                    report.due()
        finally:
            self.stats.blocked_s += time.perf_counter() - start
        self.raise_if_failed()

    def close(self) -> None:
        """Wait for the uploads (errors are logged, not raised: the caller is already leaving) and end the thread."""
        try:
            self.wait()
        except CheckpointError as err:
            logger.error("%s", err)
        self._jobs.put(None)
        self._thread.join(timeout=None if self._current is None else 1.0)  # a hung request is left to the daemon
        self._lease.stop(min(5.0, call_deadline_s()))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            name, allowed_s, run, done = job
            try:
                if self.error is None:  # after a failure later checkpoints are not published (the run raises)
                    self._current = (name, time.monotonic() + allowed_s, allowed_s)
                    self._attempt(name, run)
            finally:
                self._current = None
                done()
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()

    def _attempt(self, name: str, job: Callable[[], None]) -> None:
        for attempt in range(self.retries + 1):
            if self.error is not None:  # past the deadline meanwhile: the run has been told, no more tries
                return
            try:
                job()
                return
            except StoreLockLostError as err:  # another run holds the store now: stop, loudly, no retry
                self.error = err
                return
            except Exception as err:  # a lost connection, a refused request: retried, then raised by name
                if attempt == self.retries:
                    self.error = CheckpointError(
                        f"uploading {name} to checkpoint_store {self.store.url} failed after {attempt + 1} attempts "
                        f"({type(err).__name__}: {err}); the checkpoint is complete in the local output_dir, but "
                        "not on the store: a resume elsewhere would not see it")
                    self.error.__cause__ = err
                    logger.error("%s", self.error)
                    return
                delay = self.backoff_s * 2 ** attempt
                logger.warning("uploading %s to %s failed (%s: %s); retrying in %.1f s", name, self.store.url,
                               type(err).__name__, err, delay)
                time.sleep(delay)


__all__ = ["StoreLease", "StoreUploader", "UploadStats"]
