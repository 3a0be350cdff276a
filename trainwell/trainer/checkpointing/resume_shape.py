"""Whether a checkpoint's saved data position still fits this run (batch size, epoch length, number of processes)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...checkpoint.layout import TRAINING_ARGS_JSON_NAME

if TYPE_CHECKING:  # pragma: no cover
    from ...loops.loop_state import TrainPlan

logger = logging.getLogger("trainwell.trainer.trainer")


def data_shape_changed(args: Any, batch: int, step: int, data_state: dict[str, Any], folder: Path,
                       plan: TrainPlan) -> bool:
    """Whether the saved position counts batches of another size or epochs of another length (then warn); ``batch``
    is this run's train batch size, ``step`` the global step (for the message)."""
    saved_batch, saved_per_epoch = data_state.get("train_batch_size"), data_state.get("batches_per_epoch")
    changes = []
    if saved_batch is not None and saved_batch != batch:
        changes.append(f"train_batch_size {saved_batch} -> {batch}")
    if saved_per_epoch is not None and plan.micro_batches_per_epoch is not None and \
            saved_per_epoch != plan.micro_batches_per_epoch:
        changes.append(f"batches per epoch {saved_per_epoch} -> {plan.micro_batches_per_epoch}")
    if not changes:
        return False
    if same_global_batch(args, batch, data_state, folder, plan):
        # another number of processes, the same global batch: the position derived from the step is exact
        logger.info("The checkpoint was written by another number of processes (%s): the data position is "
                    "derived from global_step %d", ", ".join(changes), step)
        return True
    logger.warning("The checkpoint was written with another data shape (%s): the exact data position cannot "
                   "be restored, so training continues from global_step %d (epoch and batch derived from it, "
                   "as upstream). Keep per_device_train_batch_size and the dataset unchanged for an exact "
                   "resume.", ", ".join(changes), step)
    return True


def same_global_batch(args: Any, batch: int, data_state: dict[str, Any], folder: Path, plan: TrainPlan) -> bool:
    """Whether the checkpoint's run had this run's global batch and epoch, over another number of processes."""
    try:
        saved_ga = json.loads((folder / TRAINING_ARGS_JSON_NAME).read_text()).get("gradient_accumulation_steps")
    except (OSError, ValueError, AttributeError):
        return False
    saved_ranks = len(data_state.get("tr_loss_per_rank") or [])
    saved_batch, saved_per_epoch = data_state.get("train_batch_size"), data_state.get("batches_per_epoch")
    per_epoch = plan.micro_batches_per_epoch
    if saved_ranks in (0, args.world_size) or per_epoch is None or saved_ga is None or saved_batch is None \
            or saved_per_epoch is None:
        return False
    return (saved_batch * saved_ga * saved_ranks == batch * args.gradient_accumulation_steps * args.world_size
            and saved_batch * saved_per_epoch * saved_ranks == batch * per_epoch * args.world_size)


__all__ = ["data_shape_changed", "same_global_batch"]
