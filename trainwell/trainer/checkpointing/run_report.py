"""What the command line reports about a Trainer's run, read from the Trainer's checkpoint part (the command line
reads no Trainer internals)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..trainer import Trainer

__all__ = ["leave_out_resume_advice", "newest_checkpoint_of_run"]


def newest_checkpoint_of_run(trainer: Trainer) -> Path | None:
    """This run's newest complete checkpoint (None before its first save): what a resume of it would load."""
    return trainer._tw_checkpoints.of_this_run()


def leave_out_resume_advice(trainer: Trainer) -> None:
    """Leave out the resume advice of a preemption's log line (the caller prints its own resume command)."""
    trainer._tw_checkpoints.preemption_hint = None
