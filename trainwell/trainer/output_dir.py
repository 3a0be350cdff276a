"""One ``output_dir`` holds one run's checkpoints.

Checkpoints are named by their step (``checkpoint-<step>``, upstream's layout), so two runs writing into one folder
collide: the second overwrites the first's checkpoint of the same step, its rotation deletes the first's (or keeps
the first's newer ones and deletes its own), and ``resume_from_checkpoint=True`` picks whichever is newest. The rule,
the same for the Python API, the command line and every backend:

- a run that resumes a checkpoint continues that checkpoint's run: it may write over the checkpoints of the steps it
  trains again (they are the same run's, from before the point it went back to);
- a fresh run into a folder that holds trainwell checkpoints and will write checkpoints of its own is refused
  before its first step, naming the checkpoints and the three ways on: resume them (``resume_from_checkpoint=True``),
  start over (``overwrite_output_dir=True``: trainwell deletes the checkpoints it wrote), or another ``output_dir``.
  A notebook that runs ``trainer.train()`` again gets that message, and nothing on disk changes;
- folders trainwell did not write (another tool's checkpoints, a user's ``checkpoint-7``) are never deleted nor
  overwritten, and never rotated; a fresh run may train next to them (it is warned at its start when one of its saves
  would land on one of them, and that save is refused);
- a fresh run that writes no checkpoint (``save_strategy="no"``) may use the folder: it is warned that its final
  model, if saved, replaces the earlier run's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import AbstractSet, Any

logger = logging.getLogger("trainwell.trainer")


class OutputDirInUseError(ValueError):
    """A fresh run would write its checkpoints into a folder that holds another run's."""


def require_output_dir(output_dir: str | None) -> str:
    """``args.output_dir`` as the str it is once the arguments are built: the field's type takes None, which
    ``TrainingArguments.__post_init__`` replaces with ``"trainer_output"``. None set afterwards raises the TypeError
    the path functions it would go to raise."""
    if output_dir is None:
        raise TypeError("TrainingArguments.output_dir is None: set it to the folder to write into")
    return output_dir


def _names(folders: list[Path]) -> str:
    shown = [p.name for p in folders[-3:]]
    return ", ".join(shown if len(folders) <= 3 else ["...", *shown])


def claim_output_dir(args: Any, resume_from: Path | None, *, recovered: AbstractSet[str] = frozenset()) -> None:
    """Apply the rule of the module docstring for a run starting from ``resume_from`` (None: a fresh run).

    Every rank calls it and decides alike (each reads its own ``output_dir``); only the saving ranks delete.
    ``recovered``: names of checkpoints this start promoted from an interrupted save (the relaunched job's own,
    which a script asking ``get_last_checkpoint()`` before ``train()`` could not see): they do not refuse the run.
    """
    from ..checkpoint.layout import delete_checkpoint, list_complete_checkpoints

    if resume_from is not None or not args.output_dir or not Path(args.output_dir).is_dir():
        return
    own = [p for p in list_complete_checkpoints(args.output_dir) if p.name not in recovered]
    if not own:
        return  # another tool's folders only: trainwell never touches them (see _warn_foreign_checkpoints)
    writes_checkpoints = args.save_strategy != "no" or getattr(args, "enable_jit_checkpoint", False)
    if not writes_checkpoints:
        logger.warning("output_dir %s holds another run's checkpoints (%s); this run saves none, and its final model, "
                       "if saved, replaces that run's. Continue that run with train(resume_from_checkpoint=True), or "
                       "use another output_dir.", args.output_dir, _names(own))
        return
    if args.overwrite_output_dir:
        if args.should_save:
            for folder in own:
                delete_checkpoint(folder)
            logger.warning("overwrite_output_dir=True: deleted the earlier run's checkpoints in %s (%s); this run "
                           "starts over", args.output_dir, _names(own))
        return
    raise OutputDirInUseError(
        f"output_dir {args.output_dir} already holds another run's checkpoints ({_names(own)}); this fresh "
        "run would write checkpoints of the same names over them, and its rotation would delete them. Continue "
        "that run with train(resume_from_checkpoint=True), start over with "
        "TrainingArguments(overwrite_output_dir=True) (deletes them), or give this run another output_dir. Nothing "
        "was changed.")


def resume_advice(output_dir: str, folder: Path) -> str:
    """How to continue from ``folder``, this run's newest checkpoint: ``resume_from_checkpoint=True`` where that
    picks it (it is the newest of ``output_dir``), else its path (a run that went back to an older checkpoint leaves
    newer ones of its abandoned continuation, which ``True`` would pick)."""
    from ..checkpoint.layout import list_resumable_checkpoints

    found = list_resumable_checkpoints(output_dir)
    if found and found[-1].resolve() == Path(folder).resolve():
        return f"continue with train(resume_from_checkpoint=True) (it takes {Path(folder).name}, this run's newest)"
    return f"continue with train(resume_from_checkpoint={str(folder)!r}) (this run's newest checkpoint)"
