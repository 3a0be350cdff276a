"""``CodeCarbonCallback``: CO2 emissions of training (``pip install trainwell[codecarbon]``).

CodeCarbon reads its own configuration (``CODECARBON_*`` environment variables, ``.codecarbon.config``); the
emissions are written to ``output_dir/emissions.csv``. Set ``CODECARBON_LOG_LEVEL=error`` to quieten it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from ..base import TrainerCallback
from ._common import check_installed, require

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["CodeCarbonCallback"]


class CodeCarbonCallback(TrainerCallback):
    """Measures the energy of training with ``codecarbon.EmissionsTracker``, one tracker per node (local main)."""

    def __init__(self) -> None:
        check_installed("codecarbon")

        if getattr(torch.version, "hip", None):
            raise RuntimeError("CodeCarbonCallback does not support AMD ROCm (codecarbon cannot measure it): remove "
                               "'codecarbon' from report_to.")
        self.tracker: Any = None

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Create the tracker writing into ``output_dir``."""
        if self.tracker is None and state.is_local_process_zero:
            codecarbon = require("codecarbon")
            os.makedirs(args.output_dir, exist_ok=True)  # codecarbon refuses a folder that does not exist yet
            self.tracker = codecarbon.EmissionsTracker(output_dir=args.output_dir)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Start measuring."""
        if self.tracker is not None and state.is_local_process_zero:
            self.tracker.start()

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Stop measuring and write ``emissions.csv``."""
        if self.tracker is not None and state.is_local_process_zero:
            self.tracker.stop()
