"""``StopOnNonFiniteLossCallback``: an opt-in stop when training diverges (the weights hold NaN/inf).

As upstream, the Trainer itself never stops on a nan/inf loss: with ``logging_nan_inf_filter=False`` it logs the
value and trains on. Add this callback to stop instead, before the diverged weights are evaluated or saved.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from .base import TrainerCallback
from ..checkpoint.layout import get_last_checkpoint

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["StopOnNonFiniteLossCallback"]

logger = logging.getLogger(__name__)


def weights_are_finite(model: torch.nn.Module) -> bool:
    """Whether every parameter of ``model`` is finite (one device sync for the whole model)."""
    checks = []
    for param in model.parameters():
        local = param.to_local() if hasattr(param, "to_local") else param  # a DTensor shard (FSDP)
        if local.numel():
            checks.append(torch.isfinite(local.detach()).all())
    return bool(torch.stack(checks).all()) if checks else True


class StopOnNonFiniteLossCallback(TrainerCallback):
    """Stops training when the model weights became NaN/inf, before they are logged, evaluated or saved.

    The weights are checked only at the steps where the Trainer is about to log, evaluate or save (one device
    sync each time, none on the other steps), so the check costs nothing per step. A nan/inf loss whose weights are
    still finite (an fp16 step skipped by the loss scaler) does not stop training.

    Args:
        raise_error: raise ``FloatingPointError`` naming the step and the last checkpoint (default); with False,
            log an error and end training normally (``control.should_training_stop``, nothing saved at that step).
    """

    def __init__(self, raise_error: bool = True) -> None:
        self.raise_error = raise_error

    def _check(self, args: Any, state: TrainerState, control: TrainerControl, model: Any) -> None:
        if model is None or not (control.should_log or control.should_evaluate or control.should_save):
            return
        if weights_are_finite(model):
            return

        last = get_last_checkpoint(args.output_dir) if args.output_dir else None
        message = (f"Training diverged: the model weights contain NaN/inf at step {state.global_step}. Lower "
                   "learning_rate, set max_grad_norm (clipping), check the inputs/labels for NaN, or use bf16 "
                   f"instead of fp16. Nothing was saved at this step; the last checkpoint is {last or 'none'}.")
        if self.raise_error:
            raise FloatingPointError(message)
        logger.error("%s Training stops here.", message)
        control.should_log = control.should_evaluate = control.should_save = False
        control.should_training_stop = True

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                    **kwargs: Any) -> None:
        """Check the weights when this step logs, evaluates or saves."""
        self._check(args, state, control, model)

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                     **kwargs: Any) -> None:
        """Check the weights when the end of the epoch logs, evaluates or saves."""
        self._check(args, state, control, model)
