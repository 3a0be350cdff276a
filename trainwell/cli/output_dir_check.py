"""``trainwell train``'s rule for an ``--output_dir`` that holds another run: refused without
``--resume_from_checkpoint`` (its model would be overwritten), started over with ``--overwrite_output_dir``; both
decided under the folder's lock, so a live run's folder is refused, naming the run, before anything is deleted."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .arguments import CLIError
# The checkpoint modules load when the folder is checked: `trainwell --help` imports this module.

PROG = "trainwell"  # main.PROG (main imports this module)

#: Files at the top of an output_dir that a finished run leaves (its final model and state).
_RUN_FILES = ("model.safetensors", "pytorch_model.bin", "trainer_state.json", "all_results.json")
#: Files the commands write next to a run (``trainwell plot``'s curves): removed with the run by --overwrite_output_dir.
_RUN_SIDE_FILES = ("training_curves.png",)


def check_output_dir(args: Any) -> None:
    """A fresh run (no ``--resume_from_checkpoint``) into a folder holding another run's checkpoints or model is
    refused: it would overwrite that run's model and its summary would be read next to the other run's checkpoints.

    ``--overwrite_output_dir`` starts over: the earlier run's trainwell checkpoints and log are removed (folders
    trainwell did not write are kept, and said so), and the removal is printed. Both happen under the folder's lock
    (the one ``train()`` takes), so a live run's folder is refused, naming that run, before anything is deleted.
    """
    from ..checkpoint.layout import list_complete_checkpoints, list_foreign_checkpoints

    if getattr(args, "resume_from_checkpoint", None) or not args.output_dir or not os.path.isdir(args.output_dir):
        return
    root = Path(args.output_dir)
    own, foreign = list_complete_checkpoints(root), list_foreign_checkpoints(root)
    files = [name for name in _RUN_FILES if (root / name).is_file()]
    checkpoints = sorted(own + foreign, key=lambda p: int(p.name.rsplit("-", 1)[1]))
    if not checkpoints and not files:
        return
    with _output_dir_lock(args):
        own = list_complete_checkpoints(root)  # read again under the lock: what a live run wrote is not ours to take
        shown = ", ".join([p.name for p in checkpoints[-2:]] + files[:2])  # the newest checkpoints, the final model
        if not args.overwrite_output_dir:
            raise CLIError(f"--output_dir {root} already holds another run ({shown}); a fresh run would overwrite "
                           f"its model. Continue it with --resume_from_checkpoint auto, start over with "
                           f"--overwrite_output_dir (removes its checkpoints), or choose another --output_dir")
        if getattr(args, "process_index", 0) != 0:
            return
        _remove_earlier_run(root, own, foreign)


@contextmanager
def _output_dir_lock(args: Any) -> Iterator[None]:
    """Hold ``output_dir``'s lock (world process zero) for the block; a live run's lock is a :class:`CLIError`
    naming that run (its pid, host and start) instead. ``train()`` takes the lock again when it starts."""
    from ..checkpoint.lock import OutputDirLock, OutputDirLockedError

    if getattr(args, "process_index", 0) != 0:
        yield
        return
    lock = OutputDirLock(args.output_dir)
    try:
        lock.acquire()
    except OutputDirLockedError as err:
        raise CLIError(f"--output_dir {args.output_dir}: a live run is training there, so nothing was removed nor "
                       f"started: {err}") from None
    except OSError:  # a read-only output_dir: nothing can be deleted there, train() says what is wrong
        yield
        return
    try:
        yield
    finally:
        lock.release()


def _remove_earlier_run(root: Path, own: list[Path], foreign: list[Path]) -> None:
    """``--overwrite_output_dir``: delete the earlier run's trainwell checkpoints, model, state and log."""
    from ..checkpoint.layout import delete_checkpoint

    for folder in own:
        delete_checkpoint(folder)
    for name in (*_RUN_FILES, *_RUN_SIDE_FILES, "train.log"):
        if (root / name).is_file():
            (root / name).unlink()
    kept = f"; kept checkpoint folders trainwell did not write: {[p.name for p in foreign]}" if foreign else ""
    print(f"{PROG}: --overwrite_output_dir: starting over in {root}; removed the earlier run's "
          f"{len(own)} checkpoint(s) and its model, state and log{kept}", file=sys.stderr)


__all__ = ["check_output_dir"]
