"""``PrinterCallback``: prints the logs (used instead of progress bars when ``disable_tqdm``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import TrainerCallback

if TYPE_CHECKING:
    from ..utils.trainer_state import TrainerControl, TrainerState

__all__ = ["PrinterCallback", "shown_value"]


def shown_value(value: Any) -> Any:
    """How the console shows a logged value: a float with 4 significant digits (upstream 5.x: ``f"{v:.4g}"``, a
    string); anything else as it is. ``log_history`` keeps the full value."""
    return f"{value:.4g}" if isinstance(value, float) else value


class PrinterCallback(TrainerCallback):
    """Prints every ``on_log`` dict (without ``total_flos``) on the local main process."""

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Print the logs; the caller's dict is left untouched."""
        if logs is None or not state.is_local_process_zero:
            return
        shown = {key: shown_value(value) for key, value in logs.items() if key != "total_flos"}
        print(shown)
