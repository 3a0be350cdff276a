"""Runs sharing one ``output_dir``: the rule, the same for the Python API, the command line and every backend.

Checkpoints are named by their step (``checkpoint-<step>``, upstream's layout), so two runs in one folder have
checkpoints of the same names. Upstream trains into a used folder, writing over the earlier run's checkpoints and
rotating by step (so it may delete the checkpoint it has just written and keep the earlier run's). trainwell trains
too, as upstream (a notebook cell run again, two Trainers on one temporary folder, hyper-parameter trials sharing
``output_dir``), but keeps the runs apart:

- every training run has an identity (:func:`run_identity`), recorded in the completion marker of each checkpoint
  it writes; a run that resumes a checkpoint continues that checkpoint's run;
- a fresh run into a folder holding a finished run's checkpoints is warned once, naming the checkpoints it
  supersedes; its own checkpoints count as newer than every earlier run's, whatever their steps: rotation
  (``save_total_limit``) deletes the earlier run's first and never this run's newest, and ``resume_from_checkpoint
  =True``, ``"auto"`` and ``get_last_checkpoint`` take this run's newest once it has one
  (:func:`trainwell.checkpoint.layout.order_by_run`);
- a checkpoint of the same name as an earlier run's replaces it only through the atomic commit (the old folder is
  moved aside, the new one renamed into place); a kill once the new one is sealed (its marker written) leaves it
  under a temporary name, which the next start puts in place, finishing the replace. A path read before that start
  (``get_last_checkpoint``) may name the earlier run's checkpoint: ``train()`` warns when an explicit
  ``resume_from_checkpoint`` is an earlier run's than the newest complete one (:func:`warn_older_run`);
- a live run's folder is refused by the lock (:mod:`trainwell.checkpoint.lock`), whatever the arguments;
- ``overwrite_output_dir=True`` deletes the earlier run's trainwell checkpoints (under the lock) and starts over;
- folders trainwell did not write (another tool's checkpoints, a user's ``checkpoint-7``) are never deleted nor
  overwritten, and never rotated (a save that would land on one of them is refused, and said so at the start).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import AbstractSet, Any

logger = logging.getLogger("trainwell.trainer")


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

    Every rank calls it and decides alike (each reads its own ``output_dir``); only the saving ranks delete or warn.
    ``recovered``: names of checkpoints this start promoted from an interrupted save (the relaunched job's own): not
    named as superseded.
    """
    from ...checkpoint.layout import delete_checkpoint, list_complete_checkpoints

    if resume_from is not None or not args.output_dir or not Path(args.output_dir).is_dir():
        return
    earlier = [p for p in list_complete_checkpoints(args.output_dir) if p.name not in recovered]
    if not earlier or not args.should_save:
        return  # another tool's folders only: trainwell never touches them (see run_lock.warn_foreign_checkpoints)
    writes_checkpoints = args.save_strategy != "no" or getattr(args, "enable_jit_checkpoint", False)
    if writes_checkpoints and args.overwrite_output_dir:
        for folder in earlier:
            delete_checkpoint(folder)
        logger.warning("overwrite_output_dir=True: deleted the earlier run's checkpoints in %s (%s); this run "
                       "starts over", args.output_dir, _names(earlier))
    elif writes_checkpoints:
        logger.warning("output_dir %s holds an earlier run's checkpoints (%s): this fresh run supersedes them (as "
                       "upstream, it trains into the folder). Its checkpoints count as newer than those whatever "
                       "their steps: save_total_limit rotates the earlier ones away first, a save of the same step "
                       "replaces that checkpoint, and resume_from_checkpoint=True takes this run's newest. To "
                       "continue that run instead, use train(resume_from_checkpoint=True).",
                       args.output_dir, _names(earlier))
    else:
        logger.warning("output_dir %s holds another run's checkpoints (%s); this run saves none, and its final model, "
                       "if saved, replaces that run's. Continue that run with train(resume_from_checkpoint=True), or "
                       "use another output_dir.", args.output_dir, _names(earlier))


def warn_older_run(args: Any, folder: Path | None, *, recovered: AbstractSet[str] = frozenset()) -> None:
    """Warn when an explicit ``resume_from_checkpoint`` (a path in ``output_dir``) is a checkpoint of an earlier run
    than the newest complete one of ``output_dir``: this run then continues that earlier run. The usual cause is a
    path read before ``train()`` started (``get_last_checkpoint(output_dir)``) while a newer run's checkpoint still
    lay under a temporary name, which this start put in place (``recovered``: the names it put in place)."""
    from ...checkpoint.layout import checkpoint_run, list_complete_checkpoints

    if folder is None or args.process_index != 0 or not args.output_dir \
            or folder.resolve().parent != Path(args.output_dir).resolve():
        return
    found = list_complete_checkpoints(args.output_dir)
    if not found or found[-1].resolve() == folder.resolve():
        return
    newest, mine = checkpoint_run(found[-1]), checkpoint_run(folder)
    if newest is None or mine is None or newest == mine:
        return
    why = (f" ({found[-1].name} was put in place by this start from an interrupted save, so a path read before "
           "train() started, e.g. by get_last_checkpoint(output_dir), could not name it)"
           if found[-1].name in recovered else "")
    logger.warning("resume_from_checkpoint=%s is a checkpoint of an earlier run than %s, the newest checkpoint of "
                   "output_dir %s%s: this run continues that earlier run. To continue the newest run instead, pass "
                   "train(resume_from_checkpoint=True) (or its path).", str(folder), found[-1].name, args.output_dir,
                   why)


def run_identity(args: Any, resumed: Path | None) -> str:
    """The identity of a run starting from ``resumed``: that checkpoint's run (a resume continues it), else a new
    one. Rank 0's on every rank (one gather), so that every saving rank writes the same into its markers."""
    from ...checkpoint.layout import checkpoint_run

    identity = (checkpoint_run(resumed) if resumed is not None else None) or uuid.uuid4().hex[:16]
    if args.world_size > 1:
        from ...runtime.distributed import all_gather_object, is_dist

        if is_dist():
            identity = all_gather_object(identity)[0]
    return identity


def resume_advice(output_dir: str, folder: Path) -> str:
    """How to continue from ``folder``, this run's newest checkpoint: ``resume_from_checkpoint=True`` where that
    picks it (it is the newest of ``output_dir``), else its path (a run that went back to an older checkpoint leaves
    newer ones of its abandoned continuation, which ``True`` would pick)."""
    from ...checkpoint.layout import list_resumable_checkpoints

    found = list_resumable_checkpoints(output_dir)
    if found and found[-1].resolve() == Path(folder).resolve():
        return f"continue with train(resume_from_checkpoint=True) (it takes {Path(folder).name}, this run's newest)"
    return f"continue with train(resume_from_checkpoint={str(folder)!r}) (this run's newest checkpoint)"
