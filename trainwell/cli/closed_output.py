"""A run outlives its reader: ``trainwell train ... | head -3`` must not cost the run.

When the process at the other end of stdout or stderr goes away, the next write fails with ``BrokenPipeError``
(Python ignores SIGPIPE). Uncaught, that error ends training at whatever step it hit, with no checkpoint. Inside
:func:`output_may_close`, a write to a closed stream points that file descriptor at ``os.devnull`` instead: every
later write to it (print, tqdm, logging handlers holding the stream object) succeeds and goes nowhere, and training
goes on to its end, its checkpoints and ``train.log`` (a file, not the pipe) written as usual.
"""

from __future__ import annotations

import logging
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

logger = logging.getLogger("trainwell.cli")


class _StreamThatMayClose:
    """A text stream forwarding to ``stream`` until the reader leaves; then writes go to ``os.devnull``."""

    def __init__(self, stream: TextIO, name: str) -> None:
        self._stream, self._name, self.closed_by_reader = stream, name, False

    def _reader_left(self) -> None:
        if not self.closed_by_reader:
            self.closed_by_reader = True
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
            except (OSError, ValueError):  # no file descriptor (a StringIO in tests): dropping the text suffices
                pass
            logger.info("%s was closed by its reader; printing stopped, training goes on (train.log keeps the log)",
                        self._name)

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            return len(text)
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def flush(self) -> None:
        if self.closed_by_reader:
            return
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding... of the real stream
        return getattr(self._stream, name)


@contextmanager
def output_may_close() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` survive their reader closing the pipe."""
    saved = sys.stdout, sys.stderr
    sys.stdout = _StreamThatMayClose(saved[0], "stdout")
    sys.stderr = _StreamThatMayClose(saved[1], "stderr")
    try:
        yield
    finally:
        for wrapper in (sys.stdout, sys.stderr):
            if isinstance(wrapper, _StreamThatMayClose):
                wrapper.flush()
        sys.stdout, sys.stderr = saved
