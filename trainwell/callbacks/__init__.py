"""Callbacks: the base class, the default flow, progress/printing, early stopping and integrations.

Integrations (TensorBoard, MLflow, W&B, Comet, ...) import their packages only when they are used.
"""

from __future__ import annotations

from ..utils.lazy_exports import lazy_exports
from .state import ExportableState, TrainerControl, TrainerState
from .base import TrainerCallback
from .flow import DefaultFlowCallback
from .integrations import CALLBACK_MODULES, get_available_reporting_integrations, get_reporting_integration_callbacks
from .printer import PrinterCallback
from .progress import ProgressCallback

# The integrations' callbacks are imported on first use (each module is only needed when report_to names it), and so
# are the opt-in callbacks the Trainer never adds by itself.
__getattr__, __dir__ = lazy_exports(
    __name__, {**{name: f"integrations.{module}" for name, module in CALLBACK_MODULES.items()
                  if name.endswith("Callback")},
               "EarlyStoppingCallback": "early_stopping", "StopOnNonFiniteLossCallback": "divergence"}
)

__all__ = [
    "AzureMLCallback",
    "ClearMLCallback",
    "CodeCarbonCallback",
    "CometCallback",
    "DagsHubCallback",
    "DVCLiveCallback",
    "FlyteCallback",
    "KubeflowCallback",
    "NeptuneCallback",
    "SwanLabCallback",
    "TrackioCallback",
    "WandbCallback",
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
