"""The names of checkpoint folders: ``checkpoint-<step>``."""

from __future__ import annotations

import re

PREFIX_CHECKPOINT_DIR = "checkpoint"
_re_checkpoint = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"\-(\d+)$")


def is_checkpoint_name(name: str) -> int | None:
    """The step of a ``checkpoint-<step>`` folder name, or None for any other name."""
    match = _re_checkpoint.match(name)
    return int(match.group(1)) if match else None
