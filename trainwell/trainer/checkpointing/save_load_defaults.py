"""What the Trainer's upstream save and load methods do by default (``_save``, ``_save_optimizer_and_scheduler``,
``_load_from_checkpoint``, ``_load_optimizer_and_scheduler``, ``_load_rng_state``, ``_load_best_model``,
``save_model``): functions of the Trainer's checkpoint part
(:class:`~trainwell.trainer.checkpointing.checkpoints.TrainerCheckpoints`).

A checkpoint calls the Trainer's methods (a subclass's override is reached); these are what they do when not
overridden. Inside a checkpoint they write into the temporary folder the commit protocol then checksums and renames.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ...utils.secrets import without_secrets
from ...backends.base import WeightsNotGathered
from ...utils.model_utils import unwrap_model
from .output_dir_runs import require_output_dir

if TYPE_CHECKING:  # imported where used
    from ...checkpoint.manager import CheckpointContents
    from .checkpoints import TrainerCheckpoints

logger = logging.getLogger("trainwell.trainer.trainer")


def write_model_files(parts: TrainerCheckpoints, output_dir: str | os.PathLike, state_dict: Any = None) -> None:
    """The default ``_save``: the weights (``save_pretrained`` for a transformers/peft model, else
    ``model.safetensors``), the processing class (else ``data_collator.tokenizer``, as upstream) and
    ``training_args.bin`` into ``output_dir``. Only the saving process writes."""
    from ...checkpoint.digest import torch_save
    from ...checkpoint.layout import TRAINING_ARGS_NAME
    from ...checkpoint.weights import save_model_weights

    if not parts.args.should_save:
        drain = getattr(state_dict, "drain", None)
        if drain is not None:  # every rank takes part in each gather of streamed weights
            drain()
        return
    os.makedirs(output_dir, exist_ok=True)
    logger.info("Saving model checkpoint to %s", output_dir)
    save_model_weights(unwrap_model(parts._trainer.model), output_dir,
                       safe_serialization=parts.args.save_safetensors, state_dict=state_dict)
    save_processing_class(parts, output_dir)
    torch_save(without_secrets(parts.args), Path(output_dir) / TRAINING_ARGS_NAME)


def save_processing_class(parts: TrainerCheckpoints, output_dir: str | os.PathLike) -> None:
    """``processing_class.save_pretrained(output_dir)``; without one, the data collator's tokenizer (upstream)."""
    trainer = parts._trainer
    saver = trainer.processing_class
    if saver is None:
        saver = getattr(trainer.data_collator, "tokenizer", None)
        if saver is not None:
            logger.info("Saving Trainer.data_collator.tokenizer by default as Trainer.processing_class is None")
    if saver is not None and hasattr(saver, "save_pretrained"):
        saver.save_pretrained(str(output_dir))


def save_optimizer_and_scheduler(parts: TrainerCheckpoints, output_dir: str | os.PathLike) -> None:
    """The default ``_save_optimizer_and_scheduler``: ``optimizer.pt`` (unless a sharded backend saves it with
    its engine files) and ``scheduler.pt``, by the saving process."""
    from ...checkpoint.manager import write_optimizer_and_scheduler

    if not parts.args.should_save:
        return
    trainer = parts._trainer
    optimizer = None if parts.backend.caps.sharded_state else trainer.optimizer
    write_optimizer_and_scheduler(Path(output_dir), optimizer, trainer.lr_scheduler)


def loading_contents(parts: TrainerCheckpoints) -> CheckpointContents:
    from ...checkpoint.manager import CheckpointContents

    trainer = parts._trainer
    return CheckpointContents(model=unwrap_model(trainer.model), optimizer=None if parts.backend.caps.sharded_state
                              else trainer.optimizer, scheduler=trainer.lr_scheduler)


def load_optimizer_and_scheduler(parts: TrainerCheckpoints, checkpoint: str | os.PathLike | None) -> None:
    """The default ``_load_optimizer_and_scheduler``: the states a resume already validated (or, called on its
    own, read and validated now) loaded into the optimizer and scheduler."""
    if checkpoint is not None:
        parts.manager.apply_optimizer_and_scheduler(checkpoint, loading_contents(parts))


def load_rng_state(parts: TrainerCheckpoints, checkpoint: str | os.PathLike | None) -> None:
    """The default ``_load_rng_state``: this rank's random streams restored from ``checkpoint``."""
    if checkpoint is not None and not parts.manager.apply_rng(checkpoint):
        logger.info("No RNG file for process %d in %s: the random streams are not restored",
                    parts.args.process_index, checkpoint)


def load_best_model(parts: TrainerCheckpoints) -> None:
    """Reload the weights of ``state.best_model_checkpoint`` (``load_best_model_at_end``)."""
    state = parts._trainer.state
    best = state.best_model_checkpoint
    if not best or not Path(best).is_dir():
        logger.warning("load_best_model_at_end: the best checkpoint %s is missing; keeping the last weights", best)
        return
    logger.info("Loading best model from %s (score: %s).", best, state.best_metric)
    load_weights(parts, best)


def load_weights(parts: TrainerCheckpoints, folder: str | os.PathLike, model: nn.Module | None = None) -> None:
    """Load the model weights saved in ``folder`` into ``model`` (default: the Trainer's), strictly; a peft
    model's adapters (``adapter_model.safetensors``) with ``load_adapter(..., is_trainable=True)``."""
    from ...checkpoint.weights import load_checkpoint_weights

    load_checkpoint_weights(unwrap_model(model if model is not None else parts._trainer.model), folder, strict=True)


def save_model(parts: TrainerCheckpoints, output_dir: str | None = None, _internal_call: bool = False) -> None:
    """Save the model weights (``model.safetensors``, sharded above 5GB), the arguments and the processing class.

    A model with ``save_pretrained`` (a transformers model) is saved with it, config included.
    """
    from ...checkpoint.layout import TRAINING_ARGS_NAME

    trainer = parts._trainer
    output_dir = output_dir or parts.args.output_dir
    try:  # a sharded model is gathered one tensor at a time while the writing rank writes it
        weights = parts.backend.stream_state_dict(model_save=True) if parts.backend.caps.sharded_state else None
    except WeightsNotGathered as err:  # ZeRO-3 without stage3_gather_16bit_weights_on_model_save
        logger.warning("%s", err)
        parts.backend.save(Path(require_output_dir(output_dir)))  # the engine's checkpoint, written by every rank
        weights = False
    if not parts.args.should_save:
        if weights:
            weights.drain()  # every rank takes part in each gather
        if parts.args.push_to_hub and not _internal_call:  # every rank joins push_to_hub's save (collectives)
            trainer.push_to_hub(commit_message="Model save", revision=parts.args.hub_revision)
        return
    output_dir = require_output_dir(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    if weights is not False:
        parts._call_save(Path(output_dir), weights)  # the Trainer's _save (a subclass's override), as upstream
    else:  # the engine's checkpoint holds the weights; the rest of what _save writes
        save_processing_class(parts, output_dir)
        torch.save(without_secrets(parts.args), os.path.join(output_dir, TRAINING_ARGS_NAME))
    if parts.args.push_to_hub and not _internal_call:
        trainer.push_to_hub(commit_message="Model save", revision=parts.args.hub_revision)
