"""What the training loop owns during one ``train()`` call: the data position and the running losses.

:class:`DataPosition` is what a checkpoint saves (``data_state.json``) so that a resumed run reads the same batches
and logs the same values as an uninterrupted one. :class:`LoopState` holds it together with the on-device loss
accumulator and the ``logging_nan_inf_filter`` bookkeeping; the loop updates it on the hot path without a device
sync, and the Trainer asks it for the logged window, the checkpoint's ``data_state`` and the final ``train_loss``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..runtime.distributed import all_gather_object, mean_across_ranks

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
    step_learning_rate: float | None = None  # the rate the last optimizer step used (None: the schedule's own)
    skipped_steps: int = 0  # optimizer steps the fp16 scaler skipped on overflow in this call
    steps_at_start: int = 0  # the global step this call started (or resumed) at: the speed counts the steps run
    # The random states from just before the loader fetched the batch it holds ahead (None: nothing held, or the
    # collator draws nothing); a checkpoint saves them so that a resume collates that batch again from them.
    next_batch_rng: dict[str, Any] | None = None
    resumed_next_batch_rng: dict[str, Any] | None = None  # those of the checkpoint this run resumed

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
