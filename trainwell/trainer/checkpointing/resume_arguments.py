"""What a resume makes of its arguments: ``"auto"`` (:func:`resolve_auto`), and the warnings it gives when they differ
from the checkpoint's (upstream's ``compare_trainer_and_checkpoint_args``, in its words; a schedule planned for
another length): the resumed run follows the new arguments."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...args.fields import TrainingArguments
    from ...utils.trainer_state import TrainerState

logger = logging.getLogger("trainwell.trainer.trainer")


def warn_changed_arguments(args: TrainingArguments, saved: TrainerState) -> None:
    """One warning listing the step intervals and the batch size that differ between ``args`` and the checkpoint's
    trainer state, in upstream's words (``compare_trainer_and_checkpoint_args``): the resumed run follows ``args``."""
    changed = [f"\n\t{name}: {getattr(args, name)} (from args) != {getattr(saved, name)} (from trainer_state.json)"
               for name in ("logging_steps", "eval_steps", "save_steps")
               if getattr(args, name, None) is not None and getattr(saved, name, None) is not None
               and getattr(args, name) != getattr(saved, name)]
    if saved.train_batch_size is not None:
        saved_batch = saved.train_batch_size // max(1, args.n_gpu)
        if args.per_device_train_batch_size != saved_batch:
            changed.append(f"\n\tper_device_train_batch_size: {args.per_device_train_batch_size} (from args) != "
                           f"{saved_batch} (from trainer_state.json)")
    if changed:
        logger.warning("Warning: The following arguments do not match the ones in the `trainer_state.json` within the "
                       "checkpoint directory: %s", "".join(changed))


def warn_schedule_length_changed(args: TrainingArguments, saved: TrainerState, max_steps: int) -> None:
    """A resume planned for another number of steps than the checkpoint's run (a finished run continued to a larger
    ``max_steps`` or more epochs): the learning-rate schedule is built for the new length and resumed at the saved
    step, so a decaying rate jumps back up (a sawtooth in the curves). Upstream does the same, silently."""
    planned = saved.max_steps
    if not planned or planned == max_steps or args.lr_scheduler_type in ("constant", "constant_with_warmup"):
        return
    logger.warning("Resuming at step %d of a run planned for %d steps, now planned for %d: the learning-rate schedule "
                   "(%s) is laid out again over %d steps, so its rate at step %d changes (a decaying rate rises "
                   "again). To continue the old schedule, keep max_steps=%d; to decay over the new length from the "
                   "start, train a fresh run.", saved.global_step, planned, max_steps,
                   getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type), max_steps, saved.global_step,
                   planned)


def resolve_auto(resume_from_checkpoint: str | bool | None, output_dir: str | None) -> str | bool | None:
    """``"auto"``: True (newest valid checkpoint, with fallback) when ``output_dir`` holds one, else None (fresh);
    any other value as it is.

    One command then serves the first attempt of a job and every requeued one; a fresh start is logged here, a
    resume by the line that names the checkpoint (one line either way)."""
    from ...checkpoint.layout import list_resumable_checkpoints

    if not (isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() == "auto"):
        return resume_from_checkpoint
    found = list_resumable_checkpoints(output_dir) if output_dir else []
    if found:
        return True
    logger.warning("resume_from_checkpoint='auto': no checkpoint in %s; training from scratch", output_dir)
    return None
