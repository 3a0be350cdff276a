"""The library's log level: ``set_verbosity`` and the per-process levels of ``log_level`` / ``log_level_replica``.

Every trainwell module logs under the ``trainwell`` logger hierarchy. The Trainer calls
:func:`setup_process_logging` when it is built, so that (as upstream's Trainer documents under Logging) the main
process logs at ``log_level``, the replicas at ``log_level_replica``, and with ``log_on_each_node=False`` only the main
process of the first node counts as main. ``"passive"`` leaves the level as the user configured it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LIBRARY_LOGGER = "trainwell"


def get_logger(name: str | None = None) -> logging.Logger:
    """The ``trainwell`` logger, or its child ``trainwell.<name>`` (a name already under it is kept)."""
    if not name:
        return logging.getLogger(LIBRARY_LOGGER)
    if name == LIBRARY_LOGGER or name.startswith(LIBRARY_LOGGER + "."):
        return logging.getLogger(name)
    return logging.getLogger(f"{LIBRARY_LOGGER}.{name}")


def get_verbosity() -> int:
    """The effective level of the ``trainwell`` logger."""
    return logging.getLogger(LIBRARY_LOGGER).getEffectiveLevel()


def set_verbosity(level: int | str) -> None:
    """Set the ``trainwell`` logger's level (``logging.INFO`` or a name such as ``"info"``)."""
    if isinstance(level, str):
        value = logging.getLevelName(level.upper())
        if not isinstance(value, int):
            raise ValueError(f"log level {level!r} is not a logging level; use debug, info, warning, error or "
                             "critical")
        level = value
    logging.getLogger(LIBRARY_LOGGER).setLevel(level)


def passive_level() -> int:
    """What ``log_level="passive"`` resolves to: whatever the user set, on either library's logger.

    The ``trainwell`` logger's own level when one was set; else, when a script has loaded transformers' logging
    (``transformers.utils.logging.set_verbosity_info()`` in upstream's examples), transformers' verbosity, as
    upstream's ``get_process_log_level`` returns it; else WARNING. transformers is never imported here.
    """
    own = logging.getLogger(LIBRARY_LOGGER).level
    if own != logging.NOTSET:
        return own
    upstream = sys.modules.get("transformers.utils.logging")
    verbosity = getattr(upstream, "get_verbosity", None)
    if callable(verbosity):
        return int(verbosity())
    return logging.WARNING


def setup_process_logging(args: Any) -> int:
    """Apply ``args.get_process_log_level()`` to the ``trainwell`` logger; returns the level in force.

    On the main process with ``log_level="passive"`` nothing changes (the user's configuration is kept).
    """
    if getattr(args, "should_log", True) and getattr(args, "log_level", "passive") == "passive":
        return get_verbosity()
    level = args.get_process_log_level()
    set_verbosity(level)
    return level


__all__ = ["get_logger", "get_verbosity", "passive_level", "set_verbosity", "setup_process_logging"]
