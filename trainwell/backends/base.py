"""The Backend protocol: everything that differs between one device, DDP, FSDP and DeepSpeed.

The training loop talks to a backend only through this interface and asks about ``caps``, never about types.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, TypeVar

import torch
from torch import nn

_T = TypeVar("_T")


def prepared(value: _T | None, what: str) -> _T:
    """The backend's ``model`` or ``optimizer`` (``what``) once training set it up: the methods that need one run
    only after ``prepare_model`` / ``setup_optimization``, so None here is a call out of order."""
    if value is None:
        raise RuntimeError(f"the backend has no {what} yet: prepare_model / setup_optimization set it up first")
    return value


@dataclass(frozen=True)
class Capabilities:
    """What a backend does by itself, so that the loop does not do it twice."""

    handles_grad_accumulation: bool = False  # DeepSpeed accumulates, scales and clips itself
    owns_precision: bool = False  # DeepSpeed's engine / FSDP's bf16 policy casts the parameters (FSDP: autocast too)
    sharded_state: bool = False  # FSDP / ZeRO-3: saving needs every rank
    # The checkpoint state can be copied to host memory and written by trainwell's own commit on a background
    # thread (``async_save``): no engine writes files or runs collectives of its own during the save.
    async_checkpoint: bool = False
    # The engine writes files of every rank into one checkpoint folder and their index on one rank only (DCP): a
    # checkpoint is complete only on a folder every node sees (one disk per node is refused at the first save).
    engine_needs_shared_folder: bool = False
    # The engine fixes the micro-batch size when it is built (DeepSpeed's train_micro_batch_size_per_gpu), so
    # ``auto_find_batch_size`` cannot retry with a smaller one.
    fixed_micro_batch_size: bool = False
    # The backend moves the model to the device itself when it prepares it (FSDP shards it unit by unit, DeepSpeed's
    # engine), so the Trainer leaves it where it is: upstream's ``place_model_on_device = False`` for both.
    places_model: bool = False
    # ``torch_compile`` compiles inside the engine (DeepSpeed's ``engine.compile()``, as accelerate's prepare for
    # DeepSpeed does) instead of ``torch.compile`` on the engine object, which would wrap away its methods.
    compiles_in_engine: bool = False


class WeightsNotGathered(ValueError):
    """``save_model`` cannot write consolidated weights by configuration (ZeRO-3 with
    ``stage3_gather_16bit_weights_on_model_save: false``): the engine's checkpoint is saved instead."""


class Backend(Protocol):
    """Wraps the model for one execution strategy and performs backward / clip / step for it."""

    caps: Capabilities
    model: nn.Module | None  # the user's model, unwrapped (None until prepare_model)
    wrapped: nn.Module | None  # what the forward pass calls (None until prepare_model)
    optimizer: torch.optim.Optimizer | None
    lr_scheduler: Any
    num_training_steps: int | None  # set by the trainer before setup_optimization (engines building a schedule)
    # The dtype floating-point inputs are cast to before the forward pass (the engine's, DeepSpeed); None: as given.
    # Read once the engine exists (after setup_optimization / prepare_model).
    input_dtype: torch.dtype | None
    engine: Any  # the engine object users reach as ``trainer.deepspeed`` (DeepSpeed's); None for the others
    scaler: Any  # the fp16 ``GradScaler`` trainwell steps through (disabled or None when fp16 is off)
    ds_config: Any  # DeepSpeed's live ``HfDeepSpeedConfig``-like config; None for the other backends

    def model_init_context(self) -> AbstractContextManager[None]:
        """Context the trainer builds ``model_init``'s model in (ZeRO-3 partitions parameters at construction)."""

    def prepare_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Move the model to the device and wrap it; returns the module to call."""

    def setup_optimization(self, optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> None:
        """Adopt the optimizer and scheduler built by the trainer (a backend may rebuild or wrap them)."""

    def autocast(self) -> AbstractContextManager[None]:
        """Mixed-precision context for the forward pass (a no-op context when disabled)."""

    def no_sync(self, sync: bool) -> AbstractContextManager[None]:
        """Skip gradient synchronisation on accumulation micro-steps (when ``sync`` is False)."""

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (scaled when a loss scaler is active)."""

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor | None:
        """Unscale and clip gradients; returns the total norm before clipping."""

    def last_grad_norm(self) -> torch.Tensor | None:
        """The gradient norm the last optimizer step measured, for backends that clip inside it (DeepSpeed)."""

    def optimizer_step(self) -> bool:
        """Step the optimizer; False when the step was skipped (fp16 overflow)."""

    def zero_grad(self) -> None:
        """Reset gradients."""

    def state_dicts(self) -> Mapping[str, Any]:
        """Extra resumable state owned by the backend (e.g. the grad scaler)."""

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """Consolidated model weights (gathered across ranks when sharded) for ``save_model``; None when nothing is
        sharded (not yet, or not at all): the model's own ``state_dict()`` is then complete."""

    def stream_state_dict(self, *, model_save: bool) -> Any:
        """The weights as a :class:`~trainwell.checkpoint.stream.StreamedWeights` gathered one tensor at a time
        (collective; the writing ranks receive them), or None when nothing is sharded (use the model's own state
        dict). ``model_save``: for ``save_model`` (a backend whose configuration forbids gathering raises
        :class:`WeightsNotGathered`) rather than for a checkpoint's weights."""

    def gathered_parameters(self) -> AbstractContextManager[Any]:
        """A context in which the parameters are whole on every rank (ZeRO-3 gathers them), so that full weights
        load into them; a no-op context when nothing is sharded that way."""

    def check_checkpoint(self, folder: Path) -> None:
        """Raise (a ``CheckpointError``) when this rank's engine files are missing from ``folder``; run in every
        rank's validation before any rank loads, so that all fall back together. Nothing to check by default."""

    def save(self, folder: Path) -> None:
        """Write backend-specific checkpoint content (sharded weights/optimizer) into ``folder``.

        ``folder`` is the checkpoint's temporary folder: every rank calls this before the marker is written
        (the commit protocol of :mod:`trainwell.checkpoint.commit`), and the files are listed in the marker.
        """

    def load(self, folder: Path) -> None:
        """Read what :meth:`save` wrote; raise (any exception) when it cannot: all ranks then fall back together."""

    def async_engine_snapshot(self) -> Callable[[Path, Any], None] | None:
        """For ``async_save`` (backends with ``caps.async_checkpoint`` only): what :meth:`save` writes, taken now.

        Called on every rank in the training thread (it may run collectives on the training group): copies the
        backend's own checkpoint state to host memory and returns ``write(folder, group)``, which the saver thread
        calls with the temporary folder and the saver's process group (its collectives must run on that group
        only). None when the backend writes nothing beyond trainwell's files.
        """
