"""Small argparse helpers of the command line (layer 0): :class:`CLIError`, a parser whose errors raise instead of
exiting, so the ``trainwell`` command prints them as one line, and positive-number argument types."""

from __future__ import annotations

import argparse
from typing import NoReturn


class CLIError(Exception):
    """A usage error: printed as one ``trainwell: error:`` message, exit status 2."""


class RaisingArgumentParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose ``error()`` raises ``argparse.ArgumentError`` (the message and the usage
    hint) instead of printing the usage and exiting."""

    def error(self, message: str) -> NoReturn:
        hint = f" (see '{self.prog} --help')"
        # argparse calls error() again with the message of the error raised here (a missing required argument)
        raise argparse.ArgumentError(None, message if message.endswith(hint) else message + hint)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0 (``3e9`` accepted)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 3e9, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value
