"""Callbacks: the base class, the default flow, progress/printing, early stopping and integrations.

Integrations (TensorBoard, MLflow) import their packages only when they are used.
"""

from __future__ import annotations

from ..state import ExportableState, TrainerControl, TrainerState
from .base import TrainerCallback
from .divergence import StopOnNonFiniteLossCallback
from .early_stopping import EarlyStoppingCallback
from .flow import DefaultFlowCallback
from .integrations import (
    MLflowCallback,
    TensorBoardCallback,
    get_available_reporting_integrations,
    get_reporting_integration_callbacks,
)
from .printer import PrinterCallback
from .progress import ProgressCallback

__all__ = [
    "DefaultFlowCallback",
    "EarlyStoppingCallback",
    "ExportableState",
    "MLflowCallback",
    "PrinterCallback",
    "ProgressCallback",
    "StopOnNonFiniteLossCallback",
    "TensorBoardCallback",
    "TrainerCallback",
    "TrainerControl",
    "TrainerState",
    "get_available_reporting_integrations",
    "get_reporting_integration_callbacks",
]
