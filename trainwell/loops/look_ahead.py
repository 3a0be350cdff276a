"""The training loader's batches, each yielded once the next one was fetched (as accelerate's loader, upstream's).

A collator drawing from the global random streams (MLM masking) then draws in upstream's order, interleaved one
batch ahead of the forward passes' draws (dropout), so both libraries see the same numbers. The batch held ahead
was collated before the step's draws; a checkpoint taken after the step keeps the random states from just before
that fetch (:meth:`BatchLookAhead.state_dict`, one of the checkpoint's per-rank parts, saved in this rank's RNG file
under :data:`CHECKPOINT_NAME`), and a resumed run collates its first batch from them
(:meth:`BatchLookAhead.load_state_dict`).

Keeping those states costs a copy of every generator per batch (python, numpy, torch, each CUDA device), so it is
done only for loaders that draw: a collator declaring ``deterministic = True`` never pays it, one declaring False
always does, and one declaring nothing (most users' own functions) is watched on its first
:data:`WATCHED_FETCHES` fetches; when none of them drew, the states stop being kept for the rest of the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from ..checkpoint.rng import capture_rng_state, restore_rng_state, rng_states_equal

if TYPE_CHECKING:
    from ..data.stream_state import StreamPosition

__all__ = ["BatchLookAhead", "CHECKPOINT_NAME", "WATCHED_FETCHES"]

WATCHED_FETCHES = 8  # fetches of an undeclared collator compared before and after, before the copies stop
# The key of the look-ahead's state in each rank's RNG file (``rng_state[_<rank>].pth``; upstream's reader ignores it)
CHECKPOINT_NAME = "trainwell_next_batch"

_END = object()


class BatchLookAhead:
    """The training loader's one-batch look-ahead of one training run, and the random states it keeps.

    ``draws``: what the loader declares (see :func:`trainwell.data.loader.collator_draws_randomness`): True, keep
    the states before each fetch; False, never; None, watch the first :data:`WATCHED_FETCHES` fetches and stop when
    none drew. A checkpoint saves it like its other stateful parts (:meth:`state_dict` / :meth:`load_state_dict`).
    ``stream``: the position of the loader's stream, recorded just before each fetch ahead (the state after the
    last batch the step consumes; see :mod:`trainwell.data.stream_state`).
    """

    def __init__(self, draws: bool | None, stream: StreamPosition | None = None) -> None:
        self.stream = stream if stream is not None and stream.followed else None
        self.keeps_states = draws is not False
        self.watching = WATCHED_FETCHES if draws is None else 0
        # the random states from just before the fetch of the batch held ahead (None: nothing held, or not kept)
        self._held: dict[str, Any] | None = None
        self._resumed: dict[str, Any] | None = None  # loaded from a checkpoint, for the first batches() resuming

    def state_dict(self) -> dict[str, Any]:
        """The random states captured before the fetch of the batch held ahead (``capture_rng_state``'s dict); empty
        when nothing is held or the loader's collator draws nothing."""
        return dict(self._held) if self._held is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Adopt the states a checkpoint kept (empty: none): the first :meth:`batches` of a resumed epoch fetches
        its first batch from them."""
        self._held = self._resumed = dict(state) if state else None

    def batches(self, iterator: Iterator[Any], *, resuming: bool = False) -> Iterator[Any]:
        """``iterator``'s batches, one fetched ahead; the states before each fetch are kept (:meth:`state_dict`).

        ``resuming``: the epoch resumes where a checkpoint left it (its batches before were skipped): its first batch
        is fetched from the states :meth:`load_state_dict` adopted, then the stream continues where the checkpoint
        left it. The adopted states serve the first call only.
        """
        first_rng, self._resumed = (self._resumed if resuming else None), None
        if first_rng is not None:
            resumed = capture_rng_state()
            restore_rng_state(first_rng)
            current = next(iterator, _END)
            restore_rng_state(resumed)
        else:
            current = next(iterator, _END)
        stream = self.stream
        while current is not _END:
            if stream is not None:
                stream.record()
            if self.keeps_states:
                self._held = before = capture_rng_state()
                pending = next(iterator, _END)
                if self.watching:
                    self._watch(before)
            else:
                pending = next(iterator, _END)
            yield current
            current = pending
        self._held = None
        if stream is not None:
            stream.forget()

    def _watch(self, before: dict[str, Any]) -> None:
        """After a watched fetch: a fetch that drew keeps the copies for good; the last watched one that did not
        drew stops them (the held batch then needs no states: collating it again draws nothing)."""
        if not rng_states_equal(before, capture_rng_state()):
            self.watching = 0
            return
        self.watching -= 1
        if not self.watching:
            self.keeps_states = False
            self._held = None
