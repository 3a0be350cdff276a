"""The notice a SIGINT/SIGTERM prints starts on its own line when a progress bar is drawn (on a terminal or into
a pipe: ``python train.py 2>&1 | tee log`` draws the bar too), and adds no blank line when none is."""

from __future__ import annotations

import io
import logging
import signal
import sys

from tqdm.auto import tqdm

from trainwell.checkpoint.preemption import PreemptionGuard


def _notice(monkeypatch, caplog, *, bar: bool) -> str:
    """What stderr (a pipe, not a terminal) holds after the guard's handler ran, with or without an open bar."""
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    progress = tqdm(total=10, file=stderr, disable=not bar)
    progress.update(3)
    progress.refresh()  # drawn now (tqdm waits mininterval between redraws)
    guard = PreemptionGuard(signals=(signal.SIGINT,))
    with caplog.at_level(logging.WARNING, logger="trainwell.checkpoint.preemption"):
        guard._handle(signal.SIGINT, None)  # what the signal would call (no real signal to this process)
    text = stderr.getvalue()
    progress.close()
    assert guard.requested and "received SIGINT: will save a checkpoint" in caplog.text
    return text


def test_the_notice_ends_the_progress_bars_line_first(monkeypatch, caplog):
    text = _notice(monkeypatch, caplog, bar=True)
    assert "3/10" in text and text.endswith("\n")  # the bar's line is ended before the message is logged


def test_no_blank_line_without_a_progress_bar(monkeypatch, caplog):
    assert _notice(monkeypatch, caplog, bar=False) == ""
