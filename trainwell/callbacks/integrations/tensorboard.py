"""``TensorBoardCallback``: writes logs to TensorBoard event files (``pip install trainwell[tensorboard]``)."""

from __future__ import annotations

import json
import logging
import numbers
import os
from typing import TYPE_CHECKING, Any

from ...utils.trackers import is_installed
from ..base import TrainerCallback

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["TensorBoardCallback", "rewrite_logs", "as_scalar"]

logger = logging.getLogger(__name__)


def rewrite_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """Group keys for TensorBoard: ``eval_x`` -> ``eval/x``, ``test_x`` -> ``test/x``, others -> ``train/x``."""
    grouped: dict[str, Any] = {}
    for key, value in logs.items():
        if key.startswith("eval_"):
            grouped["eval/" + key[len("eval_"):]] = value
        elif key.startswith("test_"):
            grouped["test/" + key[len("test_"):]] = value
        else:
            grouped["train/" + key] = value
    return grouped


def as_scalar(value: Any) -> float | int | None:
    """``value`` as a real number (numbers, numpy scalars, one-element tensors), or ``None``."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, numbers.Real):  # numpy's scalars (as Python's int or float), Fraction
        return value.item() if hasattr(value, "item") else float(value)
    numel = getattr(value, "numel", None)
    if callable(numel) and numel() == 1 and hasattr(value, "item"):
        return value.item()
    return None


def _args_to_text(args: Any) -> str:
    """The arguments as json text (``to_json_string`` when the object has it)."""
    if hasattr(args, "to_json_string"):
        return args.to_json_string()
    if hasattr(args, "to_sanitized_dict"):
        return json.dumps(args.to_sanitized_dict(), indent=2, sort_keys=True)
    return json.dumps(vars(args), indent=2, sort_keys=True, default=str)


def _summary_writer_class() -> Any:
    """Import ``torch.utils.tensorboard.SummaryWriter``, or explain how to install it."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        raise ImportError(
            "TensorBoardCallback (report_to='tensorboard') needs the tensorboard package: "
            "`pip install trainwell[tensorboard]`, or remove 'tensorboard' from report_to."
        ) from err
    return SummaryWriter


class TensorBoardCallback(TrainerCallback):
    """Sends the logs to TensorBoard on the world main process.

    The writer (``torch.utils.tensorboard.SummaryWriter`` on ``TENSORBOARD_LOGGING_DIR`` when set, else
    ``args.logging_dir``, or a per-trial
    sub-folder during hyper-parameter search) is created on first use unless ``tb_writer`` is given.
    Numbers become scalars at ``state.global_step``, strings become text; the arguments are written
    as text at train begin. The writer is closed at train end.
    """

    def __init__(self, tb_writer: Any = None) -> None:
        if tb_writer is None and not (is_installed("tensorboard") or is_installed("tensorboardX")):
            _summary_writer_class()  # raises the error naming the pip command, at construction as upstream
        self.tb_writer = tb_writer

    def _init_summary_writer(self, args: Any, log_dir: str | None = None) -> None:
        writer_cls = _summary_writer_class()
        env_dir = os.getenv("TENSORBOARD_LOGGING_DIR")  # upstream's newest way to choose the folder
        log_dir = (log_dir or (os.path.expanduser(env_dir) if env_dir else None) or getattr(args, "logging_dir", None)
                   or os.path.join(args.output_dir, "runs"))
        self.tb_writer = writer_cls(log_dir=log_dir)

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Create the writer if needed and record the arguments (and the model config) as text."""
        if not state.is_world_process_zero:
            return
        log_dir = None
        if state.is_hyper_param_search and state.trial_name is not None:
            log_dir = os.path.join(args.logging_dir, state.trial_name)
        if self.tb_writer is None:
            self._init_summary_writer(args, log_dir)
        self.tb_writer.add_text("args", _args_to_text(args))
        config = getattr(kwargs.get("model"), "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            self.tb_writer.add_text("model_config", config.to_json_string())

    def on_log(
        self,
        args: Any,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Write numbers as scalars and strings as text at ``state.global_step``."""
        if not state.is_world_process_zero or not logs:
            return
        if self.tb_writer is None:
            self._init_summary_writer(args)
        for key, value in rewrite_logs(logs).items():
            scalar = as_scalar(value)
            if scalar is not None:
                self.tb_writer.add_scalar(key, scalar, state.global_step)
            elif isinstance(value, str):
                self.tb_writer.add_text(key, value, state.global_step)
            else:
                logger.warning(
                    "Trainer is trying to log a value of type %s for %r, which TensorBoard cannot "
                    "record as a scalar; it was dropped.",
                    type(value).__name__,
                    key,
                )
        self.tb_writer.flush()

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the writer."""
        if self.tb_writer is not None:
            self.tb_writer.close()
            self.tb_writer = None
