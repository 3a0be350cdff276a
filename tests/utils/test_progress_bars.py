"""A message from another thread or a signal handler never lands on a progress bar's line."""

from __future__ import annotations

import io
import sys

from tqdm.auto import tqdm

from trainwell.utils.progress_bars import above_progress_bars, end_progress_bar_line, progress_bar_open


def _bar(monkeypatch, *, disable: bool = False) -> tuple[io.StringIO, tqdm]:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    bar = tqdm(total=10, file=stderr, disable=disable)
    bar.update(3)
    bar.refresh()
    return stderr, bar


def test_a_message_is_written_above_the_bar_which_is_drawn_again_below_it(monkeypatch):
    stderr, bar = _bar(monkeypatch)
    try:
        assert progress_bar_open()
        with above_progress_bars():
            sys.stderr.write("uploaded checkpoint-2\n")
    finally:
        bar.close()
    before, after = stderr.getvalue().split("uploaded checkpoint-2\n")
    assert before.endswith("\r") and "3/10" in before  # the bar was cleared to the start of its line first
    assert "3/10" in after  # and drawn again on the next line


def test_the_line_is_ended_only_when_a_bar_is_drawn(monkeypatch):
    stderr, bar = _bar(monkeypatch, disable=True)
    assert not progress_bar_open()
    end_progress_bar_line()
    with above_progress_bars():
        sys.stderr.write("x\n")
    bar.close()
    assert stderr.getvalue() == "x\n"
    stderr, bar = _bar(monkeypatch)
    end_progress_bar_line()
    bar.close()
    assert "3/10 [" in stderr.getvalue().split("\n")[0]  # the bar's text, then the newline that ends its line
