"""Crash-safe checkpoint folders: atomic writes, completion markers, discovery and clean-up.

A checkpoint is written into a hidden temporary folder next to its final place
(``output_dir/.tmp-checkpoint-<step>-<pid>``). Only when every file is written and fsynced does the
completion marker ``.complete`` get written (and fsynced) and the folder renamed to
``output_dir/checkpoint-<step>``. A crash (power loss, OOM kill, disk full, preemption without grace) at any
moment therefore leaves either the previous checkpoints untouched plus a temporary folder, or a finished
checkpoint; never a folder that looks complete but is not.

Who owns what (trainwell deletes only what it wrote):

- ``checkpoint-<step>`` with the marker: trainwell's own; rotation (``save_total_limit``) may delete it.
- ``checkpoint-<step>`` without the marker: a *foreign* checkpoint (written by the upstream ``Trainer`` or
  copied by hand; trainwell's own writes only ever appear under that name complete, by rename). It is resumable
  (:func:`list_resumable_checkpoints`; validated by loading it) but never deleted, never rotated, never replaced.
- ``.tmp-checkpoint-<step>-<pid>``: trainwell's interrupted write; :func:`cleanup_incomplete` deletes it only when
  ``<pid>`` is not a live process on this host (another trainer may be in the middle of a save).

The marker holds a small JSON record (the relative path, size and checksum of every file) so that a later
truncation, deletion or change of a file is detected before anything is loaded (:func:`verify_checkpoint`).
Several ranks commit one checkpoint together through :mod:`trainwell.checkpoint.commit`.

This module imports neither torch nor numpy.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from ..utils.checkpoint_names import PREFIX_CHECKPOINT_DIR, is_checkpoint_name
from .digest import default_algorithm, hash_file
# the file syncs live in .sync; their names stay importable from here (callers and tests use layout's)
from .sync import COMPLETE_MARKER, _fsync_dir, _fsync_file, _fsync_tree, _together, fsync_files  # noqa: F401

logger = logging.getLogger(__name__)

MARKER_FORMAT = 2  # the marker record: every file with its size and checksum
TMP_PREFIX = ".tmp-"

# File names inside a checkpoint folder (upstream's names where upstream has one).
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
WEIGHTS_NAME = "pytorch_model.bin"
WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"
TRAINER_STATE_NAME = "trainer_state.json"
TRAINING_ARGS_NAME = "training_args.bin"
TRAINING_ARGS_JSON_NAME = "training_args.json"
DATA_STATE_NAME = "data_state.json"

# ".tmp-checkpoint-12-4242" (a folder being written), ".tmp-checkpoint-12-4242.old" (one moved aside by a replace:
# promoted back when the new folder never arrived) or ".tmp-checkpoint-12-4242.del" (one being deleted by rotation:
# never promoted, only removed).
_re_tmp = re.compile(r"^\.tmp-(" + PREFIX_CHECKPOINT_DIR + r"-\d+)-(\d+)(\.old|\.del)?$")
# ".tmp-universal-global_step6-4242": DeepSpeed's universal conversion of a checkpoint resumed on another number of
# processes (trainwell.backends.deepspeed.universal), by process 4242; never promoted, only removed when that died.
_re_tmp_conversion = re.compile(r"^\.tmp-universal-(.+)-(\d+)$")

class CheckpointError(RuntimeError):
    """A checkpoint folder or file is missing, incomplete, truncated or does not match the model.

    The message names the file and what is wrong with it.
    """


def is_complete(folder: str | os.PathLike) -> bool:
    """True when ``folder`` is a directory holding the completion marker."""
    path = Path(folder)
    return path.is_dir() and (path / COMPLETE_MARKER).is_file()


def _checkpoint_folders(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        step = is_checkpoint_name(child.name)
        if step is not None and child.is_dir():
            found.append((step, child))
    return sorted(found, key=lambda item: item[0])


def _run_and_time(folder: Path) -> tuple[str | None, float]:
    """The run a checkpoint belongs to (its marker's ``run``) and when it was saved; a foreign folder, an older
    marker without ``run`` or an unreadable one belongs to no named run (None), timed by the folder's mtime."""
    try:
        record = json.loads((folder / COMPLETE_MARKER).read_text(encoding="utf-8"))
        run, created = record.get("run"), float(record["created"])
        return (run if isinstance(run, str) and run else None), created
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        try:
            return None, folder.stat().st_mtime
        except OSError:
            return None, 0.0


def order_by_run(found: list[tuple[int, Path]], current_run: str | None = None) -> list[Path]:
    """``(step, folder)`` pairs from oldest to newest: run by run, each run's by step, the runs in the order they
    last saved (a marker's ``created``) and ``current_run`` (the training run's identity) after every other. So a
    fresh run into a used folder has its checkpoints after every earlier run's, whatever their step numbers."""
    runs = {path: _run_and_time(path) for _, path in found}
    if len({run for run, _ in runs.values()}) <= 1:
        return [path for _, path in found]  # one run: by step, as upstream
    last_saved: dict[str | None, float] = {}
    for run, created in runs.values():
        last_saved[run] = max(created, last_saved.get(run, created))
    rank = {run: (run is not None and run == current_run, when) for run, when in last_saved.items()}
    return [path for _, path in sorted(found, key=lambda item: (rank[runs[item[1]][0]], item[0]))]


def checkpoint_run(folder: str | os.PathLike) -> str | None:
    """The identity of the run that wrote ``folder`` (recorded in its marker), or None (foreign, or unrecorded)."""
    return _run_and_time(Path(folder))[0]


def list_complete_checkpoints(output_dir: str | os.PathLike, *, current_run: str | None = None) -> list[Path]:
    """The complete ``checkpoint-<step>`` folders of ``output_dir`` (trainwell's own), oldest first.

    Oldest first: by step within one run; with several runs in the folder, run by run (:func:`order_by_run`:
    ``current_run``'s last). Folders without the completion marker (foreign checkpoints) are left out; a missing
    ``output_dir`` gives ``[]``. Rotation works on this list only.
    """
    return order_by_run([(step, path) for step, path in _checkpoint_folders(output_dir) if is_complete(path)],
                        current_run)


def list_foreign_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The ``checkpoint-<step>`` folders of ``output_dir`` that trainwell did not write (no marker), by step."""
    return [path for _, path in _checkpoint_folders(output_dir) if not is_complete(path)]


def list_resumable_checkpoints(output_dir: str | os.PathLike, *, current_run: str | None = None) -> list[Path]:
    """Every ``checkpoint-<step>`` folder of ``output_dir``, trainwell's and foreign ones, oldest first (by step
    within one run; run by run with several, see :func:`order_by_run`): the last is the one to resume.

    trainwell never leaves a half-written folder under a ``checkpoint-<step>`` name (it writes into a temporary
    folder and renames it; a deletion renames first), so a folder without the marker is another tool's checkpoint
    (e.g. the upstream ``Trainer``'s); it is validated when it is loaded.
    """
    return order_by_run(_checkpoint_folders(output_dir), current_run)


def get_last_checkpoint(folder: str | os.PathLike) -> str | None:
    """Path of the newest ``checkpoint-<step>`` sub-folder of ``folder``, or None: the highest step (as upstream) of
    the run that saved last, when several trainwell runs trained into ``folder`` (see :func:`order_by_run`).

    trainwell's folders in the middle of being written (``.tmp-checkpoint-*``) are skipped; a ``checkpoint-<step>``
    folder written by another tool (the upstream Trainer) counts, as upstream. See :mod:`trainwell.checkpoint`.
    """
    found = list_resumable_checkpoints(folder)
    return str(found[-1]) if found else None


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process on this host (a process we may not signal counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:  # e.g. Windows without the process: treat as gone
        return False
    return True


def _dead_temp_folders(root: Path, stale_pids: frozenset[int] = frozenset()) -> list[tuple[Path, re.Match]]:
    """trainwell's temporary folders whose writing process is not alive on this host (or is in ``stale_pids``)."""
    found = []
    for child in sorted(root.iterdir()):
        match = _re_tmp.match(child.name)
        if match and child.is_dir():
            pid = int(match.group(2))
            if pid in stale_pids or not pid_alive(pid):
                found.append((child, match))
    return found


def list_incomplete(output_dir: str | os.PathLike, *, stale_pids: frozenset[int] = frozenset()) -> list[Path]:
    """Left-overs of interrupted trainwell saves and conversions: ``.tmp-checkpoint-<step>-<pid>`` and
    ``.tmp-universal-<tag>-<pid>`` (a DeepSpeed checkpoint converted to resume on another size) of dead processes.

    A temporary folder of a live process (a save in progress) and every ``checkpoint-<step>`` folder are left out;
    ``stale_pids``: pids known to have no save in flight although alive (see :func:`cleanup_incomplete`).
    """
    root = Path(output_dir)
    if not root.is_dir():
        return []
    return [path for path, _ in _dead_temp_folders(root, stale_pids)] + _dead_conversions(root, stale_pids)


def _dead_conversions(root: Path, stale_pids: frozenset[int] = frozenset()) -> list[Path]:
    """DeepSpeed universal conversions (``.tmp-universal-<tag>-<pid>``) whose converting process is gone."""
    found = []
    for child in sorted(root.iterdir()):
        match = _re_tmp_conversion.match(child.name)
        if match and child.is_dir() and (int(match.group(2)) in stale_pids or not pid_alive(int(match.group(2)))):
            found.append(child)
    return found


def _recover_interrupted_replace(root: Path, stale_pids: frozenset[int] = frozenset()) -> list[Path]:
    """Put in place the sealed (marker written) temporary folders of dead processes, never deleted as incomplete:
    renamed when the final folder is missing (a kill before or between the two renames of a replace); replacing
    the final folder when that is trainwell's and saved no later (markers' ``created``: a kill after the marker,
    before the replace of an earlier run's same-named checkpoint). A folder moved aside (``.old``) is promoted only
    when the final folder is missing (new folders first)."""
    recovered = []
    candidates = sorted(_dead_temp_folders(root, stale_pids),
                        key=lambda item: item[0].name.endswith(".old"))  # new before old
    for child, match in candidates:
        if match.group(3) == ".del" or not is_complete(child):
            continue
        final = root / match.group(1)
        if final.exists() and (match.group(3) == ".old" or not is_complete(final)
                               or _run_and_time(child)[1] < _run_and_time(final)[1]):
            continue  # removed with the other left-overs (a foreign final folder is never replaced)
        try:
            _replace_folder(child, final)
        except FileNotFoundError:  # another node's first process (same shared folder) promoted it first
            continue
        _fsync_dir(root)
        logger.warning("recovered checkpoint %s from interrupted save %s", final, child.name)
        recovered.append(final)
    return recovered


def cleanup_incomplete(output_dir: str | os.PathLike, *, at_startup: bool = False,
                       recovered: list[Path] | None = None) -> list[Path]:
    """Delete what :func:`list_incomplete` finds (trainwell's own dead temporary folders); returns the deleted paths.

    A complete temporary folder (its marker written) is never deleted: it is renamed into place when its final
    folder is missing (the process died between moving an old checkpoint of the same step aside and renaming the
    new one into place), and replaces its final folder when that is an older save of the same step (the process
    died after the marker, before the replace); see :func:`_recover_interrupted_replace`. Foreign
    ``checkpoint-<step>`` folders, other files and the temporary folders of live processes are never touched. Call
    it from the main process with the ``output_dir`` lock held (:mod:`.lock`).

    ``at_startup=True`` (a trainer starting ``train()``): no save of this process is in flight, so a folder
    named after this process's own pid is a left-over of an earlier incarnation with the same pid (a container
    restarted in a fresh PID namespace) and is promoted or removed like a dead process's. The promoted folders are
    appended to ``recovered`` when it is given.
    """
    root = Path(output_dir)
    if not root.is_dir():
        return []
    stale = frozenset({os.getpid()}) if at_startup else frozenset()
    promoted = _recover_interrupted_replace(root, stale)
    if recovered is not None:
        recovered.extend(promoted)
    removed = []
    for path in list_incomplete(root, stale_pids=stale):
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
        else:
            logger.warning("could not delete incomplete checkpoint folder %s; delete it by hand", path)
    return removed


def write_marker(folder: Path, files: Mapping[str, Mapping[str, Any]], *, run: str | None = None) -> None:
    """Write the completion marker (with the file list) into ``folder``, then fsync it and every folder of the tree
    (each once, concurrently: a folder's fsync makes the names of the files and of the marker in it durable).

    ``files`` maps each relative path to ``{"size": bytes, "<algorithm>": hex digest}``, and every file must
    already be durable (:func:`_fsync_tree`). The record:
    ``{"format": 2, "created": time, "checksum": algorithm, "files": {...}, "run": run}`` (``run``, the identity
    of the training run that saved it, only when given).
    """
    record: dict[str, Any] = {"format": MARKER_FORMAT, "created": time.time(), "checksum": default_algorithm(),
                              "files": dict(files)}
    if run is not None:
        record["run"] = run
    marker = folder / COMPLETE_MARKER
    with open(marker, "w", encoding="utf-8") as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.flush()
        folders = [Path(dirpath) for dirpath, _dirnames, _filenames in os.walk(folder)]
        _together([partial(os.fsync, handle.fileno()), *(partial(_fsync_dir, path) for path in folders)])


def read_marker(folder: str | os.PathLike) -> dict:
    """The marker's record; an empty marker or one trainwell did not write raises :class:`CheckpointError`."""
    marker = Path(folder) / COMPLETE_MARKER
    if not marker.is_file():
        raise CheckpointError(
            f"{Path(folder)} is not a complete checkpoint: the marker file {marker} is missing "
            "(the save was interrupted, or the folder was not written by trainwell)"
        )
    text = marker.read_text(encoding="utf-8").strip()
    if not text:  # trainwell never writes an empty marker: emptied metadata is the usual shape of crash damage
        raise CheckpointError(
            f"{marker}: the completion marker is empty, so the checkpoint's file list and checksums are lost "
            "(damage after a crash, or a marker created by hand); resume from another checkpoint, or, for a folder "
            "trainwell did not write (an upstream checkpoint marked by hand), delete the empty marker: the folder "
            "then resumes as a foreign checkpoint")
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{marker}: the completion marker is not valid JSON ({err})") from err
    if not _is_marker_record(record):
        raise CheckpointError(
            f"{marker}: the completion marker is not a trainwell marker record of format {MARKER_FORMAT} (a file "
            "list with each file's size and checksum), so the folder cannot be verified; resume from another "
            "checkpoint, or, for a folder trainwell did not write, delete the marker: the folder then resumes as a "
            "foreign checkpoint")
    return record


def _is_marker_record(record: Any) -> bool:
    """Whether ``record`` is what :func:`write_marker` writes: each file with its size and checksum."""
    if not isinstance(record, dict) or record.get("format") != MARKER_FORMAT:
        return False
    files, algorithm = record.get("files"), record.get("checksum")
    return isinstance(files, dict) and isinstance(algorithm, str) and all(
        isinstance(entry, dict) and "size" in entry and algorithm in entry for entry in files.values())


def marker_files(folder: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """The marker's file list as ``{relative path: {"size": int, <algorithm>: digest}}``."""
    return dict(read_marker(folder)["files"])


#: a single weights file -> the index of the sharded form a user may convert it to (upstream loads either)
_SHARDED_FORM = {"model.safetensors": "model.safetensors.index.json", "pytorch_model.bin": "pytorch_model.bin.index.json"}


def _resharded(root: Path, rel: str) -> bool:
    """Whether the weights file ``rel`` of ``root`` was replaced by its sharded form after saving: an index whose
    shards all exist. Upstream loads such a checkpoint; reading the shards checks their tensors against the model."""
    index = root / _SHARDED_FORM.get(rel, "-")
    try:
        shards = set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return bool(shards) and all(isinstance(s, str) and (root / s).is_file() for s in shards)


def verify_checkpoint(folder: str | os.PathLike, *, checksums: bool = True,
                      select: Callable[[int, str], bool] | None = None) -> None:
    """Check that every file recorded in the marker exists with its recorded size and checksum.

    Raises :class:`CheckpointError` naming the first missing, resized or changed file. ``checksums=False``
    checks sizes only; ``select(index, relative path)`` restricts the check to some files (the ranks of a job
    share the reading). An empty or foreign marker raises (see :func:`read_marker`).
    """
    root = Path(folder)
    record = read_marker(root)
    algorithm = record["checksum"]
    for index, (rel, entry) in enumerate(sorted(record["files"].items())):
        if select is not None and not select(index, rel):
            continue
        path = root / rel
        if not path.is_file():
            if _resharded(root, rel):
                logger.info("%s: %s was replaced by a sharded copy of the weights after saving; loading the shards",
                            root, rel)
                continue
            raise CheckpointError(f"{path}: file is missing from checkpoint {root} (it was deleted after saving)")
        actual, size = path.stat().st_size, entry["size"]
        if actual != size:
            raise CheckpointError(
                f"{path}: file has {actual} bytes but {size} were written (truncated or overwritten after saving)"
            )
        if checksums:
            try:
                got = hash_file(path, algorithm).digest
            except ValueError as err:
                raise CheckpointError(f"{root / COMPLETE_MARKER}: {err}") from err
            if got != entry[algorithm]:
                raise CheckpointError(
                    f"{path}: the file's {algorithm} checksum {got} differs from the {entry[algorithm]} recorded when "
                    "it was saved: its content changed on disk (bit rot, a partial copy, or an edit); resume from "
                    "another checkpoint")


def find_disk_full(err: BaseException | None) -> OSError | None:
    """The ``OSError(ENOSPC/EDQUOT)`` behind ``err``, or None. Follows ``__cause__`` and ``__context__`` (torch's zip
    writer replaces it by a ``RuntimeError`` "unexpected pos" and keeps it only as the context) and the per-rank
    ``failures`` of torch DCP's ``CheckpointException`` (a ``BaseException`` mapping each rank to ``(error,
    traceback)``)."""
    pending: list[BaseException] = [] if err is None else [err]
    seen: set[int] = set()
    while pending:
        err = pending.pop(0)
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return err
        failures = getattr(err, "failures", None)
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(inner, BaseException):
                    pending.append(inner)
        pending.extend(e for e in (err.__cause__, err.__context__) if e is not None)
    return None


def disk_full_error(err: OSError, final: Path) -> OSError:
    """The error to raise when writing ``final`` ran out of space (names the intact checkpoints and the fixes)."""
    kept = list_complete_checkpoints(final.parent)
    return OSError(err.errno, (
        f"no space left on the disk of {final.parent} while writing {final.name} ({err}); the half-written "
        f"folder was removed and the checkpoints already saved are intact (newest: "
        f"{kept[-1] if kept else 'none'}). Free disk space, lower save_total_limit, or set "
        f"save_only_model=True to write smaller checkpoints"))


def _refuse_foreign(final: Path) -> None:
    if final.exists() and not is_complete(final):
        raise CheckpointError(
            f"{final} already exists and was not written by trainwell (it has no {COMPLETE_MARKER} marker), so "
            f"trainwell will not replace it with checkpoint {final.name}; move it out of {final.parent} or use another "
            "output_dir (the earlier checkpoints are intact)")


def _replace_folder(tmp: Path, final: Path, *, moved_aside: Callable[[], None] | None = None) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` (trainwell's) is moved aside first and deleted afterwards.

    A kill between the two renames leaves both complete under temporary names; the next start promotes the new one
    (:func:`cleanup_incomplete`). ``moved_aside()`` is called between them (the kill tests' hook)."""
    _refuse_foreign(final)
    aside = None
    if final.exists():
        aside = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}.old"
        if aside.exists():
            shutil.rmtree(aside)
        os.rename(final, aside)
        if moved_aside is not None:
            moved_aside()
    try:
        os.rename(tmp, final)
    except BaseException:
        if aside is not None:
            os.rename(aside, final)
        raise
    _fsync_dir(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


@contextmanager
def atomic_checkpoint_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder; on success it becomes ``final`` atomically, on error it is removed.

    On leaving the block without an exception: every file is fsynced, the completion marker is written and
    fsynced, the temporary folder is renamed to ``final`` (an existing ``final``, e.g. the same step saved
    again, is moved aside and deleted after the rename) and the parent folder is fsynced. On an exception
    (disk full, serialisation error, KeyboardInterrupt) the temporary folder is deleted and the exception
    re-raised: checkpoints already on disk are untouched.
    """
    final = Path(final)
    _refuse_foreign(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        (tmp / COMPLETE_MARKER).unlink(missing_ok=True)  # the caller may not pre-empt the marker
        write_marker(tmp, _fsync_tree(tmp))
        _replace_folder(tmp, final)
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        full = find_disk_full(err)
        if full is not None:
            raise disk_full_error(full, final) from err
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_atomic(path: str | os.PathLike, data: bytes | str | Callable[[Path], None]) -> Path:
    """Write one file atomically: write a temporary sibling, fsync it, ``os.replace`` it onto ``path``.

    ``data`` is the content (bytes, or str written as UTF-8) or a callable that writes the file at the
    temporary path it receives (``lambda p: torch.save(obj, p)``). Readers see the old or the new file,
    never a partial one. Returns ``path``.
    """
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        if callable(data):
            data(tmp)
        else:
            payload = data.encode("utf-8") if isinstance(data, str) else data
            tmp.write_bytes(payload)
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    return path


def delete_checkpoint(folder: str | os.PathLike) -> None:
    """Delete a checkpoint folder trainwell wrote (one with the marker); a foreign folder is left alone.

    The folder is first renamed away (to ``.tmp-checkpoint-<step>-<pid>.del``, which a later start removes and
    never promotes), then its marker and files are deleted, so a crash at any moment never leaves a folder
    without its marker under a ``checkpoint-<step>`` name (which would look foreign). When the rename fails the
    folder is left complete and untouched.
    """
    path = Path(folder)
    if not is_complete(path):
        if path.exists():
            logger.warning("not deleting %s: it has no %s marker, so trainwell did not write it", path,
                           COMPLETE_MARKER)
        return
    doomed = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}.del"
    if doomed.exists():
        shutil.rmtree(doomed, ignore_errors=True)
    try:
        os.rename(path, doomed)
    except OSError as err:
        logger.warning("could not delete checkpoint %s (%s); it stays complete", path, err)
        return
    _fsync_dir(path.parent)
    (doomed / COMPLETE_MARKER).unlink(missing_ok=True)
    shutil.rmtree(doomed, ignore_errors=True)
