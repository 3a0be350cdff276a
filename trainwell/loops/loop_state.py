"""What the training loop owns during one ``train()`` call: the data position and the running losses.

:class:`DataPosition` is what a checkpoint saves (``data_state.json``) so that a resumed run reads the same batches
and logs the same values as an uninterrupted one. :class:`LoopState` holds it together with the on-device loss
accumulator and the ``logging_nan_inf_filter`` bookkeeping; the loop updates it on the hot path without a device
sync, and the Trainer asks it for the logged window, the checkpoint's ``data_state`` and the final ``train_loss``.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sized
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch

from ..data.loader import has_length
from ..runtime.distributed import all_gather_object, mean_across_ranks

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
    from ..utils.trainer_state import TrainerState

# With logging_nan_inf_filter, the step losses of a window are kept for the rare case of a nan/inf; beyond this
# many micro-batches without a log they are folded in (one device sync), so the list stays small.
WINDOW_SETTLE_EVERY = 4096


@dataclass
class DataPosition:
    """Where the data stream stands: the epoch and how many of its micro-batches were consumed.

    Saved in every checkpoint together with the loss accumulators, so a resumed run logs exactly what an uninterrupted
    run logs.
    """

    epoch: int = 0
    batches_in_epoch: int = 0
    tr_loss: float = 0.0  # loss summed since the last log (rank 0's; every rank's in tr_loss_per_rank)
    total_loss: float = 0.0  # loss summed over the logged windows (for train_loss)
    last_logged_step: int = 0
    # The epoch's shape when saved: a resume with another batch size or dataset length cannot reuse the batch count.
    batches_per_epoch: int | None = None
    train_batch_size: int | None = None
    # Each rank's running loss (rank order): every rank resumes its own, so the window that spans a resume logs
    # the same mean as an uninterrupted run.
    tr_loss_per_rank: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DataPosition":
        """Inverse of :meth:`to_dict` (unknown keys ignored)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    def running_loss_of(self, rank: int, world_size: int) -> float:
        """The running loss ``rank`` resumes with: its own when saved by as many ranks; else the saved ranks' mean
        (what the next log averages), or ``tr_loss`` for a checkpoint written before per-rank losses were saved."""
        saved = self.tr_loss_per_rank
        if not saved:
            return self.tr_loss
        if len(saved) == world_size:
            return float(saved[rank])
        return math.fsum(saved) / len(saved)


class Resumed(NamedTuple):
    """What a resume restored for the run: where the data stream stood and the checkpoint's TrainerState (None when
    it has none). (The run's stateful parts, its look-ahead among them, are loaded in place.)"""

    position: DataPosition
    state: TrainerState | None


@dataclass(eq=False)
class LoopState:
    """The training loop's own state, passed to the loop functions and read by the Trainer.

    ``tr_loss`` is this rank's loss summed on the device since the last log (updated without a sync);
    ``total_loss`` the logged windows (means over ranks) summed, for ``train_loss``; ``last_logged_step`` the
    global step of the last log. With ``logging_nan_inf_filter`` the micro-batch losses of the window are kept in
    ``window_losses`` and only replayed when the window sum is not finite (see :meth:`settle`).
    """

    position: DataPosition
    tr_loss: torch.Tensor
    total_loss: float = 0.0
    last_logged_step: int = 0
    window_losses: list[tuple[int, torch.Tensor]] | None = None
    window_base: float = 0.0  # the settled value of tr_loss the kept window_losses add to
    window_filtered: bool = False  # a nan/inf micro-batch loss was replaced since the last log
    accumulation_steps: int = 1
    tokens_trained: int = 0  # input tokens this process trained on in this call (include_tokens_per_second)
    step_learning_rate: float | None = None  # the rate the last optimizer step used (None: no step ran yet)
    skipped_steps: int = 0  # optimizer steps the fp16 scaler skipped on overflow in this call
    steps_at_start: int = 0  # the global step this call started (or resumed) at: the speed counts the steps run
    flos: float = 0.0  # FLOPs counted since the last store_flos (the Trainer's current_flos)
    # What training_step divides the micro-batch's loss by (the Trainer's current_gradient_accumulation_steps)
    accumulation_divisor: int | float | torch.Tensor = 1
    window_size: int = 1  # the micro-batches of the step running (a model's router loss counts once per window)

    @classmethod
    def start(cls, position: DataPosition, *, device: torch.device, nan_inf_filter: bool, accumulation_steps: int,
              rank: int = 0, world_size: int = 1) -> "LoopState":
        """The state of a run starting (or resuming) at ``position``."""
        own = position.running_loss_of(rank, world_size)
        return cls(position=position, tr_loss=torch.tensor(own, device=device), total_loss=position.total_loss,
                   last_logged_step=position.last_logged_step, window_losses=[] if nan_inf_filter else None,
                   window_base=own, accumulation_steps=accumulation_steps)

    def settle(self) -> float:
        """This rank's loss summed since the last log, with ``logging_nan_inf_filter`` applied; one device sync.

        The filter (as upstream) counts a nan/inf micro-batch loss as the window's running average. The loop only
        records the micro-batch losses; they are replayed here, and only when the sum is not finite, so the hot path
        pays a list append instead of tensor operations.
        """
        total = self.tr_loss.item()
        steps = self.window_losses
        if not steps:
            return total
        if not math.isfinite(total):
            total = self.window_base
            for global_step, loss in steps:
                value = float(loss)
                window = 1 + global_step - self.last_logged_step
                total += value if math.isfinite(value) else total / (window * self.accumulation_steps)
            self.tr_loss.fill_(total)
            self.window_filtered = True
        steps.clear()
        self.window_base = total
        return total

    def close_window(self, global_step: int) -> float:
        """End the logging window at ``global_step``: returns its loss summed over the steps (the mean over ranks: a
        collective); the accumulator starts again from zero."""
        self.settle()
        window = mean_across_ranks(self.tr_loss).item()
        self.tr_loss.zero_()
        self.window_base, self.window_filtered = 0.0, False
        self.total_loss += window
        self.last_logged_step = global_step
        return window

    def final_total(self) -> float:
        """All the loss of the run (the logged windows and what is left since the last log); a collective."""
        self.settle()
        return self.total_loss + mean_across_ranks(self.tr_loss).item()

    def data_state(self, global_step: int) -> dict[str, Any]:
        """What ``data_state.json`` records: the position and every rank's running loss (a collective, so every
        rank calls it at save time)."""
        position = self.position
        own = self.settle()
        position.tr_loss_per_rank = [float(v) for v in all_gather_object(own)]
        position.tr_loss = position.tr_loss_per_rank[0]
        position.total_loss = self.total_loss
        position.last_logged_step = self.last_logged_step
        return {**position.to_dict(), "global_step": global_step}


@dataclass
class TrainPlan:
    """How long training runs, computed from the data and the arguments."""

    micro_batches_per_epoch: int | None  # None for a dataset without a length
    updates_per_epoch: int | None
    max_steps: int
    num_epochs: int
    num_examples: int | None
    total_train_batch_size: int


def plan_training(args: TrainingArguments, dataloader: Any, world_size: int,
                  batch_size: int | None = None) -> TrainPlan:
    """Steps and epochs from ``num_train_epochs`` (fractional allowed) or ``max_steps``.

    ``batch_size`` is the per-process batch size in use (``args.train_batch_size`` unless ``auto_find_batch_size``
    lowered it).
    """
    ga = args.gradient_accumulation_steps
    batch_size = batch_size or args.train_batch_size
    total_batch = batch_size * ga * world_size
    if has_length(dataloader):
        micro = len(dataloader)
        updates = max(math.ceil(micro / ga), 1)
        if args.max_steps > 0:
            max_steps = args.max_steps
            epochs = math.ceil(max_steps / updates)
        else:
            max_steps = math.ceil(args.num_train_epochs * updates)
            epochs = math.ceil(args.num_train_epochs)
        dataset = getattr(dataloader, "dataset", None)  # a loader of the user's own may have none (upstream's too)
        examples = len(cast("Sized", dataset)) if has_length(dataset) else micro * batch_size
        return TrainPlan(micro, updates, max_steps, epochs, examples, total_batch)
    if args.max_steps <= 0:
        raise ValueError(
            "The training dataset has no length (an IterableDataset), so num_train_epochs cannot be turned into a "
            "number of steps: set max_steps=N in TrainingArguments"
        )
    return TrainPlan(None, None, args.max_steps, sys.maxsize, args.max_steps * total_batch, total_batch)
