"""What the ecosystem jobs share: reading their command line and stopping a run right after a checkpoint."""

import sys


def option(name: str, default=None):
    """The value after ``--name`` in the command line, else ``default``."""
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


def stop_after_save(step: int):
    """A callback ending training right after the checkpoint of ``step`` is saved (an interrupted run)."""
    from transformers import TrainerCallback

    class StopAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True
            return control

    return StopAfterSave()
