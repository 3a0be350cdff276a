"""``auto_find_batch_size``: retry training with a smaller batch after an out-of-memory error.

Upstream wraps its training loop in accelerate's ``find_executable_batch_size``; this follows its semantics: the
errors that count as out-of-memory are the same (plus any ``torch.OutOfMemoryError``), the per-device batch size is
multiplied by 0.9 (rounded down) after each one, and training restarts with a new dataloader. The size in use is
the Trainer's ``_train_batch_size`` (recorded as ``state.train_batch_size`` in ``trainer_state.json``); a resume with
``auto_find_batch_size`` starts from the size saved in the checkpoint.
"""

from __future__ import annotations

import gc
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .run import TrainingRun
from .train_loop import run_training

if TYPE_CHECKING:
    from .contract import RunParts, RunTrainer

logger = logging.getLogger("trainwell.trainer.trainer")

# The messages accelerate's should_reduce_batch_size recognises (a RuntimeError with one of them as its only arg).
OUT_OF_MEMORY_MESSAGES = (
    " out of memory.",  # CUDA, HIP, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # HPU
)
REDUCTION = 0.9  # accelerate's factor (upstream's documented "exponential decay")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` means the batch did not fit in memory (so a smaller batch may)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return (isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str)
            and any(message in error.args[0] for message in OUT_OF_MEMORY_MESSAGES))


def smaller_batch_size(batch_size: int) -> int:
    """The next size to try after an out-of-memory error at ``batch_size``."""
    return int(batch_size * REDUCTION)


def release_device_memory() -> None:
    """Free what the failed attempt left cached (garbage first, so its tensors are gone)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def saved_batch_size(folder: Path | None) -> int | None:
    """``train_batch_size`` recorded in a checkpoint's ``trainer_state.json`` (None when absent)."""
    if folder is None:
        return None
    path = Path(folder) / "trainer_state.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("train_batch_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def train_finding_batch_size(trainer: RunTrainer, *, parts: RunParts, resume_from: Path | None, trial: Any,
                             ignore_keys_for_eval: list[str] | None) -> TrainingRun:
    """:func:`run_training` of a new :class:`TrainingRun`, retried with a smaller batch after each out-of-memory
    error; returns the run that trained to its end.

    The optimizer and schedule built for the failed attempt are dropped (rebuilt for the new number of steps);
    ones passed to the Trainer are kept. Optimizer steps taken before the error stay in the weights, as upstream.
    """
    if trainer.backend.caps.fixed_micro_batch_size:
        raise ValueError("auto_find_batch_size is not supported with DeepSpeed (the engine fixes the micro-batch "
                         "size when it is built): set per_device_train_batch_size yourself, or drop `deepspeed`.")
    batch_size = saved_batch_size(resume_from)
    given = trainer.optimizer, trainer.lr_scheduler
    optimizers = None  # the first attempt starts from the Trainer's own
    while True:
        run: TrainingRun | None = None
        try:
            run = TrainingRun(trainer, parts=parts, resume_from=resume_from, trial=trial, ignore_keys_for_eval=ignore_keys_for_eval,
                              batch_size=batch_size, optimizers=optimizers)
            return run_training(run)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            failed = trainer._train_batch_size
            smaller = smaller_batch_size(failed)
            if smaller < 1:
                raise RuntimeError(f"auto_find_batch_size: out of memory even with a batch size of {failed} per "
                                   "device; use a smaller model, gradient checkpointing or less memory-hungry "
                                   "options") from error
            del error  # drop the traceback's frames (and the tensors they hold) before freeing memory
            if run is not None:
                run.close()
            if trainer.optimizer is not None:
                trainer.optimizer.zero_grad(set_to_none=True)
            run = None
            release_device_memory()
            logger.warning("auto_find_batch_size: out of memory with a batch size of %d per device; retrying with "
                           "%d", failed, smaller)
            batch_size, optimizers = smaller, given
