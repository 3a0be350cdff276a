"""The commit protocol of a checkpoint, the same for one process and for every rank of every backend.

1. Rank 0's pid names the temporary folder ``output_dir/.tmp-checkpoint-<step>-<pid>`` (broadcast, so every rank
   writes into the same folder); the saving rank(s) create it; all ranks meet (collective 1).
2. Every rank writes its files into it: the saving rank(s) the model, optimizer, scheduler, state and arguments,
   every rank its own ``rng_state_<rank>.pth``; files written by trainwell are hashed as they are written. Then the
   backend's engine writes its files there too (DeepSpeed ``engine.save_checkpoint``, DCP shards, the consolidated
   ZeroRedundancyOptimizer state): these calls are collectives of their own. A rank that does not seal fsyncs its
   own files (together) before it reports them.
3. All ranks exchange what they wrote and whether they succeeded (collective 2). If any rank failed, the
   temporary folder is removed and every rank raises: no checkpoint, the previous ones untouched.
4. The saving rank (each node's with ``save_on_each_node``) checks every reported file is visible, then seals:
   a. fsyncs, together, every file not yet durable: its own, and the engine's, which it also hashes;
   b. writes the ``.complete`` marker listing every file of every rank (size and checksum);
   c. fsyncs, together, the marker and every folder of the tree (once each);
   d. renames the folder to ``checkpoint-<step>`` and fsyncs ``output_dir``.
   All ranks exchange the outcome (collective 3) before anyone goes on: a failure to seal (e.g. a rank's file not
   visible where the marker is written) raises on every rank.

Nothing is written into a folder after its marker. A kill at any point leaves the earlier checkpoints intact and at
most a ``.tmp-`` folder, which the next ``train()`` removes, or, once its marker is written (sealed), puts in place
(finishing the replace of a same-named checkpoint of an earlier run: a sealed folder is never "incomplete"); an
interrupt the process survives long enough to handle (a second Ctrl-C during the save) removes the temporary folder
at once.

Durability: what each sync is for. The guarantee is that once a save returns, its checkpoint survives a power cut
or a kernel crash (a killed process loses nothing the kernel already holds), and that a ``checkpoint-<step>`` name
never appears before every byte its marker vouches for is on disk. That takes, per checkpoint, and no more:

- one fsync per file, before the marker is written: a file's bytes and size reach the disk only by its own fsync
  (a folder's fsync does not write them). Without it a power cut could leave a marker whose files are empty: the
  resume would catch it (the checksums) and fall back to an older checkpoint, but the newest would be lost. A file
  trainwell writes is hashed as it is written and synced once, in step 4a (never on close and again later); an
  engine file is synced once and then hashed (from the page cache: the hash reads what the fsync made durable).
- one fsync of the marker and one of each folder of the tree, after the marker exists: a file's name is an entry of
  its folder, made durable by the folder's fsync, which covers every entry created before it. So one per folder, at
  the end, covers the files' names and the marker's (the protocol used to sync the top folder once before the marker
  and again after it).
- one fsync of ``output_dir`` after the rename: it makes the new name durable, and with it the temporary folder's
  own entry. (A power cut before it leaves the complete folder under its temporary name, which the next start
  promotes, or the earlier state: never a half-written ``checkpoint-<step>``.)

A transformers model's checkpoint (10 files) thus takes 13 fsyncs instead of 14. What costs the time is not the
number of calls but the journal commits behind them: an fsync on ext4 or XFS waits for a commit of the file
system's journal and a cache flush of the device, a few milliseconds each on a shared disk. Concurrent fsyncs are
committed together (group commit), so the syncs of steps 4a and 4c each run at once, a thread per call: a
checkpoint pays three commits (4a, 4c, the rename's) where one fsync after the other paid one per call. Measured
(``bench/save_cost.py``, see ``docs/save_cost.md``): a tiny GPT-2's checkpoint took 74.5 ms, now 52 ms, on a 2-core
VM's shared disk (upstream's, without any fsync: 21 ms).

Test hook: with the environment variable ``TRAINWELL_TEST_KILL_AT=<phase>:<step>:<rank>[,...]`` the process of that
rank SIGKILLs itself at that phase of the save of ``checkpoint-<step>``. Phases, in order: ``files`` (its own files
written), ``engine`` (the engine's files written, before collective 2), ``marker`` (after collective 2, before the
marker), ``rename`` (marker written, before the rename), ``aside`` (a same-named checkpoint of an earlier run moved aside,
before the new folder is renamed into place), ``renamed`` (before collective 3); with ``checkpoint_store``, ``upload`` and
``published`` (see :mod:`.store`). It exists for the
kill tests (``tests/distributed/test_kill_resume.py``) and costs one environment lookup per save.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from . import digest, layout
from .layout import CheckpointError
from .nodes import node_index
from .ranks import Ranks

logger = logging.getLogger(__name__)

KILL_ENV = "TRAINWELL_TEST_KILL_AT"


def test_hook(phase: str, step: int, rank: int) -> None:
    """SIGKILL this process when ``TRAINWELL_TEST_KILL_AT`` names ``phase:step:rank`` (see the module docstring)."""
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) == 3 and parts[0] == phase and parts[1] == str(step) and parts[2] == str(rank):
            os.kill(os.getpid(), signal.SIGKILL)


def _record(root: Path, written: dict[str, digest.FileDigest]) -> dict[str, tuple[int, str]]:
    """The files this rank wrote under ``root``, as ``{relative path: (size, digest)}`` (picklable)."""
    base = str(root.resolve()) + os.sep
    return {path[len(base):].replace(os.sep, "/"): (d.size, d.digest) for path, d in written.items()
            if path.startswith(base)}


def _merge(reports: list[dict[str, Any]], me: int) -> dict[str, digest.FileDigest]:
    """The files the marker written by rank ``me`` must list: every rank's, or its node's with several savers (one
    disk per node; nodes as the launcher numbers them, see :mod:`.nodes`)."""
    savers = sum(1 for report in reports if report["saves"])
    node = reports[me]["node"]
    merged: dict[str, digest.FileDigest] = {}
    for report in reports:
        if savers > 1 and report["node"] != node:
            continue
        for rel, (size, value) in report["files"].items():
            merged[rel] = digest.FileDigest(size, value)
    return merged


def _seal(tmp: Path, final: Path, reported: dict[str, digest.FileDigest], step: int, rank: int, *,
          run: str | None = None, own: Collection[str] = ()) -> None:
    """Check every reported file is visible, sync this rank's ``own`` files (absolute paths, hashed but not yet
    synced) and the unreported ones (which it hashes) together, write the marker (naming ``run``), rename into place
    (a same-named checkpoint of a finished run is moved aside first: after a kill anywhere past the marker the next
    start puts the sealed folder in place, see :func:`layout.cleanup_incomplete`)."""
    for rel, expected in reported.items():
        path = tmp / rel
        if not path.is_file() or path.stat().st_size != expected.size:
            raise CheckpointError(
                f"{path}: written by another rank but not visible (or of another size) where the marker is written; "
                "the output_dir must be on a file system every rank sees, or set save_on_each_node=True when each "
                "node has its own disk")
    known = {str((tmp / rel).resolve()): value for rel, value in reported.items()}
    files = layout._fsync_tree(tmp, known, unsynced=own)
    layout.write_marker(tmp, files, run=run)
    test_hook("rename", step, rank)
    layout._replace_folder(tmp, final, moved_aside=lambda: test_hook("aside", step, rank))


def commit_checkpoint(final: Path, step: int, ranks: Ranks, *, should_save: bool,
                      write_files: Callable[[Path], None],
                      engine_save: Callable[[Path], None] | None = None, run: str | None = None) -> Path:
    """Write checkpoint ``final`` with the protocol of the module docstring; a collective when several ranks run.

    ``run``: the identity of the training run, recorded in the marker (see :func:`layout.order_by_run`).

    ``write_files(tmp)`` writes this rank's own files (it is called on every rank); ``engine_save(tmp)`` lets the
    backend's engine write its files (called on every rank, even after ``write_files`` failed, so that the
    engine's collectives stay matched). Returns ``final``.
    """
    final = Path(final)
    pid = ranks.gather(os.getpid())[0]
    tmp = final.parent / f"{layout.TMP_PREFIX}{final.name}-{pid}"
    if should_save:
        final.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():  # our own name: a left-over of this very process (a save retried after an error)
            shutil.rmtree(tmp)
        tmp.mkdir()
    try:
        return _write_and_seal(final, tmp, step, ranks, should_save=should_save, write_files=write_files,
                               engine_save=engine_save, run=run)
    except BaseException as exc:
        # A KeyboardInterrupt (a second Ctrl-C while the checkpoint is written) or a SystemExit is not an error the
        # ranks report to each other: it leaves this process now, and takes its temporary folder with it.
        if should_save and not isinstance(exc, Exception):
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_and_seal(final: Path, tmp: Path, step: int, ranks: Ranks, *, should_save: bool,
                    write_files: Callable[[Path], None], engine_save: Callable[[Path], None] | None,
                    run: str | None = None) -> Path:
    """Steps 2 to 4 of the protocol: from the barrier after the temporary folder exists to the rename."""
    ranks.barrier()
    error: BaseException | None = None
    with digest.recording() as written:
        try:
            write_files(tmp)
            test_hook("files", step, ranks.rank)
        except Exception as err:  # reported to every rank below; the engine's collectives must still run
            error = err
        try:
            if engine_save is not None:
                engine_save(tmp)
            test_hook("engine", step, ranks.rank)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: B036 - DCP's CheckpointException (a full disk...) is a BaseException
            error = error or err
    if not should_save and error is None:  # reported below: durable first (a sealing rank syncs its own in _seal)
        try:
            layout.fsync_files(written)
        except OSError as err:
            error = err
    report = {"host": socket.gethostname(), "node": node_index(ranks.rank), "saves": should_save, "files": _record(tmp, written),
              "error": None if error is None else f"{type(error).__name__}: {error}"}
    reports = ranks.gather(report)
    failed = [(r, rep["error"]) for r, rep in enumerate(reports) if rep["error"] is not None]
    sealed: BaseException | None = None
    try:
        if failed:
            raise CheckpointError(f"saving {final.name} failed on rank(s) " + "; ".join(
                f"{r}: {message}" for r, message in failed) + "; the partial folder was removed, the earlier "
                "checkpoints are intact")
        test_hook("marker", step, ranks.rank)
        if should_save:
            _seal(tmp, final, _merge(reports, ranks.rank), step, ranks.rank, run=run, own=written)
            test_hook("renamed", step, ranks.rank)
    except Exception as err:  # every rank learns the outcome below, so none waits for a rank that gave up
        sealed = err
    outcomes = ranks.gather(None if sealed is None else f"{type(sealed).__name__}: {sealed}")
    if sealed is None and any(outcomes):
        sealed = CheckpointError(f"saving {final.name} failed on another rank: "
                                 + "; ".join(o for o in outcomes if o))
    if sealed is not None:
        if should_save:
            shutil.rmtree(tmp, ignore_errors=True)
        cause = error if error is not None else sealed
        full = layout.find_disk_full(cause)
        if full is not None:
            raise layout.disk_full_error(full, final) from cause
        raise cause
    return final
