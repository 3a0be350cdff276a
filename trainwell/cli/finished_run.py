"""``--resume_from_checkpoint`` into a run that has already reached ``--max_steps``: nothing to train.

Resuming a checkpoint whose step is at or past ``max_steps`` would run no step and then rewrite the finished run's
top-level files (its ``train_results.json`` runtime, its model, its state) with those of an empty run. The command
says so and leaves the run alone; raising ``--max_steps`` trains on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..checkpoint.layout import list_resumable_checkpoints


def checkpoint_to_resume(args: Any, resume: str | bool | None) -> Path | None:
    """The checkpoint folder ``trainer.train(resume_from_checkpoint=resume)`` would load, or None (a fresh run)."""
    if resume is None or resume is False:
        return None
    if isinstance(resume, str) and resume.strip().lower() not in ("", "auto"):
        return Path(resume)

    found = list_resumable_checkpoints(args.output_dir) if os.path.isdir(args.output_dir) else []
    return found[-1] if found else None


def steps_already_done(checkpoint: Path) -> int | None:
    """The ``global_step`` recorded in ``checkpoint``'s ``trainer_state.json`` (None when unreadable)."""
    try:
        return int(json.loads((checkpoint / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def nothing_left_to_train(args: Any, resume: str | bool | None) -> str | None:
    """A one-line message when the checkpoint to resume is already at or past ``args.max_steps``; else None."""
    if not args.max_steps or args.max_steps <= 0:
        return None  # epochs decide: the Trainer computes the length from the data
    checkpoint = checkpoint_to_resume(args, resume)
    step = steps_already_done(checkpoint) if checkpoint is not None else None
    if step is None or step < args.max_steps:
        return None
    return (f"{checkpoint} is already at step {step}, at or past --max_steps {args.max_steps}: nothing to train; "
            f"the finished run's files are left as they are. Pass a larger --max_steps to train on.")
