"""``DefaultFlowCallback``: turns the logging/evaluation/saving arguments into ``control`` decisions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..utils.option_enums import IntervalStrategy, SaveStrategy
from .base import TrainerCallback

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["DefaultFlowCallback"]


class DefaultFlowCallback(TrainerCallback):
    """Decides when to log, evaluate, save and stop, from the ``*_strategy`` arguments.

    Step intervals are read from ``state.logging_steps``/``eval_steps``/``save_steps`` (integers set by
    ``TrainerState.compute_steps``); ``args.eval_delay`` postpones the first evaluation (in steps for
    the ``steps`` strategy, in epochs for ``epoch``). At ``max_steps`` training stops; with the ``steps``
    strategies that last step is also evaluated (unless ``eval_delay`` is beyond it) and saved, as in transformers
    5.24 (whose evaluation at the end changes what ``load_best_model_at_end`` can pick).
    """

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """Set the log/evaluate/save/stop flags after an optimizer step."""
        step = state.global_step
        if step == 1 and getattr(args, "logging_first_step", False):
            control.should_log = True
        # Each interval test (a positive interval the step is a multiple of) is written out and ordered to fail early
        # on the steps where nothing is due: logging is by steps (the default), evaluation and saving often "no".
        if (state.logging_steps > 0 and step % state.logging_steps == 0
                and args.logging_strategy == IntervalStrategy.STEPS):
            control.should_log = True
        if (
            args.eval_strategy == IntervalStrategy.STEPS
            and state.eval_steps > 0
            and step % state.eval_steps == 0
            and (getattr(args, "eval_delay", 0) or 0) <= step
        ):
            control.should_evaluate = True
        if args.save_strategy == SaveStrategy.STEPS and state.save_steps > 0 and step % state.save_steps == 0:
            control.should_save = True
        if step >= state.max_steps:
            control.should_training_stop = True
            # As transformers 5.24: the last step is evaluated and saved when the step strategies would otherwise
            # miss it (max_steps not a multiple of the interval). The epoch strategies need nothing here: the loop
            # ends the epoch after its last step, and on_epoch_end evaluates and saves once.
            if args.eval_strategy == IntervalStrategy.STEPS and (getattr(args, "eval_delay", 0) or 0) <= step:
                control.should_evaluate = True
            if args.save_strategy == SaveStrategy.STEPS:
                control.should_save = True
        return control

    def on_epoch_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> TrainerControl:
        """Set the log/evaluate/save flags for the ``epoch`` strategies."""
        if args.logging_strategy == IntervalStrategy.EPOCH:
            control.should_log = True
        epoch = state.epoch if state.epoch is not None else 0
        if args.eval_strategy == IntervalStrategy.EPOCH and (getattr(args, "eval_delay", 0) or 0) <= epoch:
            control.should_evaluate = True
        if args.save_strategy == SaveStrategy.EPOCH:
            control.should_save = True
        return control
