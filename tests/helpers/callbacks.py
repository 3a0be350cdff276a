"""Callbacks the tests share."""

from __future__ import annotations

from trainwell import TrainerCallback


class StopAtStep(TrainerCallback):
    """Stops training once ``global_step`` reaches ``step`` (after that step's checkpoint: a stand-in for a crash)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True
        return control
