"""``LogFileCallback``: a plain-text log of a run in ``output_dir`` (``train.log``), to read after the fact.

On the world main process, for the duration of ``train()``, it appends to ``<output_dir>/train.log``:

* a header line when training starts (time, steps, the step it resumes from),
* every logged dict (``on_log``), as ``<time> step <N> {json}``,
* the warnings of the ``trainwell`` logger and the Python warnings shown meanwhile (they still reach the console).

It appends, so a resumed run continues the same file. ``trainwell train`` adds it; in Python,
``trainer.add_callback(LogFileCallback())``. The file is written by trainwell, in ``output_dir`` but never in a
checkpoint folder.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from .base import TrainerCallback

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["LogFileCallback", "LOG_FILE_NAME"]

LOG_FILE_NAME = "train.log"
_LIBRARY_LOGGER = "trainwell"


class _ConsoleHandler(logging.Handler):
    """What logging's last resort does when no handler is configured (warnings to the current stderr): adding the
    file handler would otherwise silence the console."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # pragma: no cover - as logging.Handler.handleError would
            pass


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN/inf: JSON has no literal for them
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


class LogFileCallback(TrainerCallback):
    """Appends the run's logs and warnings to ``<output_dir>/<file_name>`` (world main process only)."""

    def __init__(self, file_name: str = LOG_FILE_NAME, level: int = logging.WARNING) -> None:
        self.file_name = file_name
        self.level = level
        self._file: TextIO | None = None
        self._handlers: list[logging.Handler] = []
        self._previous_showwarning: Any = None

    @property
    def path(self) -> Path | None:
        """The log file while it is open."""
        return Path(self._file.name) if self._file is not None else None

    def _line(self, text: str) -> None:
        if self._file is not None:
            self._file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
            self._file.flush()

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Open the file (append) and start capturing warnings."""
        self._close()  # a previous train() that raised never reached on_train_end
        if not state.is_world_process_zero or not getattr(args, "output_dir", None):
            return
        os.makedirs(args.output_dir, exist_ok=True)
        self._file = open(Path(args.output_dir) / self.file_name, "a", encoding="utf-8")
        handler = logging.StreamHandler(self._file)
        handler.setLevel(self.level)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                               "%Y-%m-%d %H:%M:%S"))
        logger = logging.getLogger(_LIBRARY_LOGGER)
        self._handlers = [handler]
        if not logger.hasHandlers():
            console = _ConsoleHandler(logging.WARNING)
            self._handlers.append(console)
        for h in self._handlers:
            logger.addHandler(h)
        self._previous_showwarning = warnings.showwarning

        def showwarning(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                        line: str | None = None) -> None:
            self._line(f"WARNING {warnings.formatwarning(message, category, filename, lineno, line).strip()}")
            self._previous_showwarning(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        start = f", resuming at step {state.global_step}" if state.global_step else ""
        self._line(f"training started: max_steps {state.max_steps}{start} (pid {os.getpid()})")

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """One line per logged dict."""
        if logs is not None:
            self._line(f"step {state.global_step} {json.dumps({k: _jsonable(v) for k, v in logs.items()})}")

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the file and stop capturing."""
        if self._file is not None:
            self._line(f"training ended at step {state.global_step}")
        self._close()

    def _close(self) -> None:
        if self._file is None:
            return
        logger = logging.getLogger(_LIBRARY_LOGGER)
        for handler in self._handlers:
            logger.removeHandler(handler)
        self._handlers = []
        if self._previous_showwarning is not None:
            warnings.showwarning = self._previous_showwarning
            self._previous_showwarning = None
        self._file.close()
        self._file = None
