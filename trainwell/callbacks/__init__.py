"""Callbacks: the base class, the default flow, progress/printing, early stopping and integrations.

Integrations (TensorBoard, MLflow, W&B, Comet, ...) import their packages only when they are used.
"""

from __future__ import annotations

from ..utils.lazy_exports import lazy_exports
from ..utils.tracker_table import TRACKER_TABLE, callback_exports
from ..utils.trainer_state import ExportableState, TrainerControl, TrainerState
from .base import TrainerCallback
from .flow import DefaultFlowCallback
from .integrations import get_available_reporting_integrations, get_reporting_integration_callbacks
from .printer import PrinterCallback
from .progress import ProgressCallback

# The integrations' callbacks are imported on first use (each module is only needed when report_to names it), and so
# are the opt-in callbacks the Trainer never adds by itself.
__getattr__, __dir__ = lazy_exports(
    __name__, {**callback_exports(__name__),
               "EarlyStoppingCallback": "early_stopping", "StopOnNonFiniteLossCallback": "divergence"}
)

__all__ = sorted([
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "ExportableState",
    "PrinterCallback",
    "ProgressCallback",
    "StopOnNonFiniteLossCallback",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "get_available_reporting_integrations",
    "get_reporting_integration_callbacks",
    *(t.callback for t in TRACKER_TABLE),
])
