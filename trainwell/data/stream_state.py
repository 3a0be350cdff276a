"""Where a stream of training examples stands, so that a resume continues from it instead of re-reading it.

A map-style dataset resumes by seeking its sampler (:class:`~trainwell.data.samplers.ResumableSampler`); an
``IterableDataset`` has no sampler, so without more it resumes as upstream does: its first batches are read again and
discarded, which costs as long as reading them did. A dataset that can say its position (``state_dict()`` /
``load_state_dict()``: a ``datasets.IterableDataset``, any user's iterable written so) is resumed from that position
at once. :class:`StreamPosition` is the checkpoint's per-rank part that holds it (saved in this rank's RNG file under
:data:`CHECKPOINT_NAME`, so each rank restores its own); :meth:`StreamPosition.restore` decides at the resume whether
the saved position is exact, and says which way the stream resumes (one log line).

The training loader fetches one batch ahead of the step (:class:`~trainwell.loops.look_ahead.BatchLookAhead`), so the
dataset's live state is one batch past what training consumed: the look-ahead calls :meth:`StreamPosition.record`
just before it fetches the batch it holds ahead, which keeps the state the dataset had after the last example of the
last consumed batch.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

__all__ = ["CHECKPOINT_NAME", "StreamPosition", "stateful_stream", "unexact_reason"]

logger = logging.getLogger("trainwell.trainer.trainer")

# The key of the stream's state in each rank's RNG file (``rng_state[_<rank>].pth``; upstream's reader ignores it)
CHECKPOINT_NAME = "trainwell_stream"


def stateful_stream(dataloader: Any) -> Any | None:
    """The training loader's ``IterableDataset`` when it can say its position (``state_dict`` and
    ``load_state_dict``), unwrapped from trainwell's length check; None otherwise (a map-style dataset, an iterable
    without them)."""
    dataset = getattr(dataloader, "dataset", None)
    if not isinstance(dataset, torch.utils.data.IterableDataset):
        return None
    dataset = getattr(dataset, "dataset", dataset) if type(dataset).__name__ == "LengthCheckedIterable" else dataset
    if callable(getattr(dataset, "state_dict", None)) and callable(getattr(dataset, "load_state_dict", None)):
        return dataset
    return None


def unexact_reason(dataset: Any) -> str | None:
    """Why restoring ``dataset``'s own state would not give the examples an uninterrupted run sees (None: it would).

    ``datasets``' ``shuffle(buffer_size=...)`` saves no shuffle buffer (its documentation: "examples from shuffle
    buffers are lost when resuming and the buffers are refilled with new data"), so its resumed order differs; a
    user's dataset may declare ``exact_state = False`` for the same reason.
    """
    if getattr(dataset, "exact_state", True) is False:
        return "its state_dict declares itself inexact (exact_state = False)"
    node, seen = getattr(dataset, "_ex_iterable", None), 0
    while node is not None and seen < 64:  # datasets' chain of examples iterables, outermost first
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return "its state leaves out the shuffle buffer of shuffle(buffer_size=...)"
        children = getattr(node, "ex_iterables", None)
        if children:  # interleaved or concatenated streams
            reasons = [unexact_reason(_Chain(child)) for child in children]
            return next((r for r in reasons if r), None)
        node, seen = getattr(node, "ex_iterable", None), seen + 1
    return None


class _Chain:
    """An examples iterable of ``datasets`` seen as the dataset :func:`unexact_reason` walks."""

    def __init__(self, node: Any) -> None:
        self._ex_iterable = node


class StreamPosition:
    """The position of one rank's training stream: a per-rank part of the checkpoint.

    ``dataset``: the stateful stream (:func:`stateful_stream`), or torchdata's ``StatefulDataLoader`` over it with
    worker processes (its ``state_dict`` holds every worker's position), or None when the position cannot be said;
    ``reason``: why it is not followed (worker processes hold the position, ...), logged at a resume;
    ``world_size``: the processes training, saved with the state (another number at the resume re-reads).
    """

    def __init__(self, dataset: Any | None, *, world_size: int = 1, reason: str | None = None) -> None:
        self.dataset = dataset if reason is None else None
        self.reason = reason or (None if dataset is not None else "the dataset has no state_dict/load_state_dict")
        self.world_size = world_size
        self._state: Any = None  # the dataset's state after the last consumed batch (None: none recorded)
        self._saved: dict[str, Any] | None = None  # what a checkpoint held, for the resume

    @classmethod
    def of(cls, dataloader: Any, *, world_size: int) -> StreamPosition:
        """The position of ``dataloader``'s stream (followed only when batches are loaded in this process: with
        ``dataloader_num_workers > 0`` each worker holds its own copy of the dataset and its position)."""
        dataset = stateful_stream(dataloader)
        reason = None
        if not isinstance(getattr(dataloader, "dataset", None), torch.utils.data.IterableDataset):
            reason = "the loader's sampler cannot seek"
        elif dataset is not None and getattr(dataloader, "num_workers", 0) > 0:
            if type(dataloader).__name__ == "PreparedStatefulDataLoader":  # torchdata's: it gathers the workers'
                return cls(dataloader, world_size=world_size)
            reason = ("dataloader_num_workers > 0: the position lives in the worker processes; pip install "
                      "'trainwell[stream]' (torchdata) to restore it")
        return cls(dataset, world_size=world_size, reason=reason)

    @property
    def followed(self) -> bool:
        """Whether the stream's state is recorded at each batch."""
        return self.dataset is not None

    def record(self) -> None:
        """Keep the dataset's state now (called just before the loader fetches the batch it holds ahead: the state
        after the last consumed batch)."""
        if self.dataset is not None:
            self._state = copy.deepcopy(self.dataset.state_dict())

    def forget(self) -> None:
        """No consumed batch in the current pass (an epoch ended): nothing to restore mid-epoch."""
        self._state = None

    def state_dict(self) -> dict[str, Any]:
        """The recorded state and the number of processes (empty when nothing was recorded)."""
        if self._state is None:
            return {}
        return {"state": self._state, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt what a checkpoint held (empty: nothing), for :meth:`restore`."""
        self._saved = dict(state) if state else None

    def restore(self, skip_batches: int) -> bool:
        """At a resume ``skip_batches`` into an epoch: load the saved position into the dataset and return True
        (the stream then continues from the next example), or return False when the batches must be re-read
        (the reason is logged, with their number)."""
        saved, self._saved = self._saved, None
        reason = self.reason
        if reason is None:
            source = self.dataset
            reason = unexact_reason(source.dataset if isinstance(source, torch.utils.data.DataLoader) else source)
        if reason is None and saved is None:
            reason = "the checkpoint holds no stream position"
        if reason is None and saved is not None and saved.get("world_size") != self.world_size:
            reason = (f"the checkpoint's stream positions were saved by {saved.get('world_size')} processes and "
                      f"{self.world_size} train now")
            logger.warning("Resuming on another number of processes: %s; the position is reached by re-reading",
                           reason)
        if reason is not None or saved is None or self.dataset is None:
            logger.info("re-reading %d batches to reach the position (%s)", skip_batches, reason)
            return False
        logger.info("resuming the stream from its saved position (%d batches in; none re-read)", skip_batches)
        self.dataset.load_state_dict(copy.deepcopy(saved["state"]))
        self._state = saved["state"]
        return True
