"""What a preempted run prints: its progress bar ended first, and an async save said "saved" only once committed."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ...checkpoint.async_save import AsyncSaver

logger = logging.getLogger("trainwell.trainer.trainer")

__all__ = ["close_progress_bars", "wait_for_preemption_save"]


def close_progress_bars(handler: Any) -> None:
    """End the progress bar's line before a message: a bar still drawn would have the message glued to it."""
    for callback in handler.callbacks:
        bar = getattr(callback, "training_bar", None)
        if bar is not None:
            bar.close()
            callback.training_bar = None


def wait_for_preemption_save(saver: AsyncSaver, handler: Any, preempted: str, folder: Path) -> bool:
    """Say that the background save of ``folder`` started (``preempted``: which signal, which step), wait for it to
    end; whether it was committed (the caller says "saved" only then)."""
    close_progress_bars(handler)
    logger.warning("%s: saving checkpoint in %s (in the background; it is not complete until a line says saved)",
                   preempted, folder)
    saver.join()
    return not saver.failed


def raise_if_preempted(checkpoints: Any, step: int, output: Any) -> None:
    """End ``train()`` as upstream's script ends on the signal once a preemption stopped the run (its checkpoint
    saved): raise :class:`~trainwell.checkpoint.preemption.TrainingPreempted` (exit status 130/143 uncaught), so
    nothing after ``train()`` runs as if training had finished; a script that goes on catches it."""
    if checkpoints.preempted:
        from ...checkpoint.preemption import TrainingPreempted  # loaded by a preemption only

        raise TrainingPreempted(checkpoints.preempted_by or "SIGTERM", step, output,
                                checkpoints.preemption_checkpoint)
