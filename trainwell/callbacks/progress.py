"""``ProgressCallback``: tqdm progress bars for training and evaluation, and logs written above them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import TrainerCallback
from .printer import shown_value

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["ProgressCallback"]


def _has_length(obj: Any) -> bool:
    """Whether ``obj`` has a usable ``len()`` (an IterableDataset loader raises TypeError)."""
    try:
        return obj is not None and len(obj) is not None
    except (TypeError, NotImplementedError):
        return False


def format_logs(logs: dict[str, Any], max_str_len: int) -> dict[str, Any]:
    """Copy ``logs`` for display: drop ``total_flos``, floats to 4 significant digits (as upstream 5.x), strings
    over ``max_str_len`` elided."""
    shown: dict[str, Any] = {}
    for key, value in logs.items():
        if isinstance(value, str) and len(value) > max_str_len:
            value = (
                f"[String too long to display, length: {len(value)} > {max_str_len}. "
                "Consider increasing `max_str_len` if needed.]"
            )
        shown[key] = shown_value(value)
    shown.pop("total_flos", None)
    return shown


class ProgressCallback(TrainerCallback):
    """Shows a training bar (optimizer steps) and an evaluation bar on the world main process.

    ``args.disable_tqdm`` hides the bars and the log lines. Logs are written with ``tqdm.write`` so
    they appear above the bar; strings longer than ``max_str_len`` are elided.
    """

    def __init__(self, max_str_len: int = 100) -> None:
        self.training_bar: Any = None
        self.prediction_bar: Any = None
        self.max_str_len = max_str_len
        self.current_step = 0

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Open the training bar with ``state.max_steps`` steps."""
        if state.is_world_process_zero:
            from tqdm.auto import tqdm

            disable = bool(getattr(args, "disable_tqdm", False))
            self.training_bar = tqdm(total=state.max_steps, dynamic_ncols=True, disable=disable)
        self.current_step = 0

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Advance the training bar by the steps done since the last update."""
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.update(state.global_step - self.current_step)
            self.current_step = state.global_step

    def on_prediction_step(
        self, args: Any, state: TrainerState, control: TrainerControl, eval_dataloader: Any = None, **kwargs: Any
    ) -> None:
        """Advance (opening it on the first batch) the evaluation bar when the loader has a length."""
        if not (state.is_world_process_zero and _has_length(eval_dataloader)):
            return
        if self.prediction_bar is None:
            from tqdm.auto import tqdm

            self.prediction_bar = tqdm(
                total=len(eval_dataloader),
                leave=self.training_bar is None,
                dynamic_ncols=True,
                disable=bool(getattr(args, "disable_tqdm", False)),
            )
        self.prediction_bar.update(1)

    def _close_prediction_bar(self, state: TrainerState) -> None:
        if state.is_world_process_zero and self.prediction_bar is not None:
            self.prediction_bar.close()
        self.prediction_bar = None

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the evaluation bar."""
        self._close_prediction_bar(state)

    def on_predict(self, args: Any, state: TrainerState, control: TrainerControl, metrics: dict[str, Any] | None = None,
                   **kwargs: Any) -> None:
        """Close the prediction bar."""
        self._close_prediction_bar(state)

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write the logs above the training bar (not when ``disable_tqdm``)."""
        if not state.is_world_process_zero or self.training_bar is None or logs is None:
            return
        if getattr(args, "disable_tqdm", False):
            return
        self.training_bar.write(str(format_logs(logs, self.max_str_len)))

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the training bar."""
        if state.is_world_process_zero and self.training_bar is not None:
            self.training_bar.close()
        self.training_bar = None
