"""The training loader's batches, each yielded once the next one was fetched (as accelerate's loader, upstream's).

A collator drawing from the global random streams (MLM masking) then draws in upstream's order, interleaved one
batch ahead of the forward passes' draws (dropout), so both libraries see the same numbers. The batch held ahead
was collated before the step's draws; a checkpoint taken after the step keeps the random states from just before
that fetch (``LoopState.next_batch_rng``), and a resumed run collates its first batch from them.

Keeping those states costs a copy of every generator per batch (python, numpy, torch, each CUDA device), so it is
done only for loaders that draw: a collator declaring ``deterministic = True`` never pays it, one declaring False
always does, and one declaring nothing (most users' own functions) is watched on its first
:data:`WATCHED_FETCHES` fetches; when none of them drew, the states stop being kept for the rest of the run.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..checkpoint.rng import capture_rng_state, restore_rng_state, rng_states_equal
from .loop_state import LoopState

__all__ = ["BatchLookAhead", "WATCHED_FETCHES"]

WATCHED_FETCHES = 8  # fetches of an undeclared collator compared before and after, before the copies stop

_END = object()


class BatchLookAhead:
    """Whether the look-ahead keeps the random states before each fetch, for one training run.

    ``draws``: what the loader declares (see :func:`trainwell.data.loader.collator_draws_randomness`): True, keep
    them; False, never; None, watch the first :data:`WATCHED_FETCHES` fetches and stop when none drew.
    """

    def __init__(self, draws: bool | None) -> None:
        self.keeps_states = draws is not False
        self.watching = WATCHED_FETCHES if draws is None else 0

    def batches(self, iterator: Iterator[Any], loop: LoopState,
                first_rng: dict[str, Any] | None = None) -> Iterator[Any]:
        """``iterator``'s batches, one fetched ahead; the states before each fetch go to ``loop.next_batch_rng``.

        ``first_rng``: the states the checkpoint this run resumes kept for its held batch: the first batch is
        fetched from them, then the stream continues where the checkpoint left it.
        """
        if first_rng is not None:
            resumed = capture_rng_state()
            restore_rng_state(first_rng)
            current = next(iterator, _END)
            restore_rng_state(resumed)
        else:
            current = next(iterator, _END)
        while current is not _END:
            if self.keeps_states:
                loop.next_batch_rng = before = capture_rng_state()
                pending = next(iterator, _END)
                if self.watching:
                    self._watch(before, loop)
            else:
                pending = next(iterator, _END)
            yield current
            current = pending
        loop.next_batch_rng = None

    def _watch(self, before: dict[str, Any], loop: LoopState) -> None:
        """After a watched fetch: a fetch that drew keeps the copies for good; the last watched one that did not
        drew stops them (the held batch then needs no states: collating it again draws nothing)."""
        if not rng_states_equal(before, capture_rng_state()):
            self.watching = 0
            return
        self.watching -= 1
        if not self.watching:
            self.keeps_states = False
            loop.next_batch_rng = None
