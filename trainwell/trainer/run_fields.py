"""Upstream's Trainer attributes whose values belong to the running ``train()`` call.

``current_flos``, ``current_gradient_accumulation_steps``, ``_total_loss_scalar`` and ``_globalstep_last_logged`` are
upstream's attributes (callbacks, subclasses and the libraries built on the Trainer read and set them); trainwell's
loop keeps their values in the run's :class:`~trainwell.loops.loop_state.LoopState`. :class:`RunField` is the
attribute on the Trainer class that reads and writes the running (or last) run's field, and a value of the Trainer's
own before its first run.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunField"]


class RunField:
    """The Trainer attribute backed by ``trainer._tw_run.loop.<field>`` (``default`` before the first run)."""

    def __init__(self, field: str, default: Any, doc: str) -> None:
        self.field, self.default, self.__doc__ = field, default, doc

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        if trainer is None:
            return self
        run = trainer._tw_run
        if run is not None:
            return getattr(run.loop, self.field)
        return trainer._tw_before_run.get(self.field, self.default)

    def __set__(self, trainer: Any, value: Any) -> None:
        run = trainer._tw_run
        if run is not None:
            setattr(run.loop, self.field, value)
        else:
            trainer._tw_before_run[self.field] = value
