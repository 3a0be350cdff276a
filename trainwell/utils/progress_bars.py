"""Messages that do not land on a progress bar's line.

tqdm draws a bar by rewriting the current line (``\\r``), on a terminal and into a pipe alike (``python train.py
2>&1 | tee log``), so a message written while a bar is open would be glued to the bar's text. tqdm keeps every open
bar that is not disabled in one class-wide set; a process that never imported tqdm has no bar. This module never
imports tqdm.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


def _tqdm_class() -> Any:
    """tqdm's base class when tqdm is imported (every bar class derives from it and shares its set), else None."""
    return getattr(sys.modules.get("tqdm.std"), "tqdm", None)


def progress_bar_open() -> bool:
    """Whether a tqdm progress bar is being drawn (the trainer's, or any other)."""
    instances: Any = getattr(_tqdm_class(), "_instances", None)
    try:
        return bool(instances) and any(not getattr(bar, "disable", False) for bar in list(instances))
    except TypeError:  # not tqdm's set: no bar we know how to see
        return False


def end_progress_bar_line() -> None:
    """Write a newline to stderr when a bar is open, so that what follows starts on a line of its own. For a signal
    handler (which must not take tqdm's lock: the bar being drawn may hold it); elsewhere prefer
    :func:`above_progress_bars`."""
    if not progress_bar_open():
        return
    try:
        sys.stderr.write("\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed or broken stderr: the message itself fails the same way, or goes elsewhere
        pass


@contextmanager
def above_progress_bars() -> Iterator[None]:
    """Within the block, write (log) a message: the open bars are cleared first and drawn again below it, under
    tqdm's lock, so another thread's line never splits a bar being drawn (tqdm's ``external_write_mode``, what
    ``tqdm.write`` uses). Without an open bar the block runs as it is."""
    cls = _tqdm_class()
    if cls is None or not progress_bar_open():
        yield
        return
    with cls.external_write_mode(file=sys.stderr):
        yield
