"""``PlainProgressCallback``: progress as plain lines, for output that goes to a file (nohup, SLURM logs).

A tqdm bar redraws itself with carriage returns and escape codes, which a log file keeps as one huge line. This
callback prints instead, on the world main process, one line at most every ``interval`` seconds (and at the last
step)::

    [trainwell] step 200/800 (25%) | epoch 0.35 | 9.8 steps/s | elapsed 0:20 | eta 1:01

and each logged dict as one ``[trainwell] {...}`` line. Evaluation shows no bar at all.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from .base import TrainerCallback
from .progress import format_logs

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["PlainProgressCallback"]


def _clock(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class PlainProgressCallback(TrainerCallback):
    """Periodic one-line progress reports and log lines, without carriage returns or escape codes."""

    def __init__(self, interval: float = 10.0, stream: TextIO | None = None, max_str_len: int = 100) -> None:
        self.interval = interval
        self.stream = stream
        self.max_str_len = max_str_len
        self._start = 0.0
        self._last_print = 0.0
        self._first_step = 0

    def _write(self, line: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        stream.write(f"[trainwell] {line}\n")
        stream.flush()

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Start the clock (a resumed run measures its speed from the step it resumed at)."""
        self._start = self._last_print = time.monotonic()
        self._first_step = state.global_step
        if state.is_world_process_zero:
            self._write(f"training: {state.max_steps} steps" + (f", from step {state.global_step}"
                                                               if state.global_step else ""))

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """A progress line when ``interval`` seconds passed since the last one, and at the last step."""
        if not state.is_world_process_zero:
            return
        now = time.monotonic()
        if now - self._last_print < self.interval and state.global_step < state.max_steps:
            return
        self._last_print = now
        elapsed = now - self._start
        done = state.global_step - self._first_step
        rate = done / elapsed if elapsed > 0 else 0.0
        total = max(state.max_steps, 1)
        parts = [f"step {state.global_step}/{state.max_steps} ({100 * state.global_step // total}%)"]
        if state.epoch is not None:
            parts.append(f"epoch {state.epoch:.2f}")
        parts.append(f"{rate:.1f} steps/s")
        parts.append(f"elapsed {_clock(elapsed)}")
        if rate > 0:
            parts.append(f"eta {_clock((state.max_steps - state.global_step) / rate)}")
        self._write(" | ".join(parts))

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """Each logged dict on its own line."""
        if state.is_world_process_zero and logs is not None:
            self._write(str(format_logs(logs, self.max_str_len)))
