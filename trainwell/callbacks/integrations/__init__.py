"""Reporting integrations (``report_to``): name -> callback class; each imports its package only when used.

Every name upstream accepts has a callback here. Building the Trainer builds the callbacks, and a callback whose
package is missing raises :class:`~trainwell.trackers.MissingIntegrationError` (one error naming every missing
package and the pip command) before anything else happens.
"""

from __future__ import annotations

from ...trackers import (
    TRACKERS,
    MissingIntegrationError,
    get_available_reporting_integrations,
    is_installed,
    missing_packages_error,
)
from ..base import TrainerCallback
from .clearml import ClearMLCallback
from .codecarbon import CodeCarbonCallback
from .comet import CometCallback
from .dvclive import DVCLiveCallback
from .hosted import AzureMLCallback, DagsHubCallback, FlyteCallback, KubeflowCallback
from .mlflow import MLflowCallback
from .neptune import NeptuneCallback
from .swanlab import SwanLabCallback
from .tensorboard import TensorBoardCallback, rewrite_logs
from .trackio import TrackioCallback
from .wandb import WandbCallback

__all__ = [
    "INTEGRATION_TO_CALLBACK",
    "AzureMLCallback",
    "ClearMLCallback",
    "CodeCarbonCallback",
    "CometCallback",
    "DagsHubCallback",
    "DVCLiveCallback",
    "FlyteCallback",
    "KubeflowCallback",
    "MLflowCallback",
    "MissingIntegrationError",
    "NeptuneCallback",
    "SwanLabCallback",
    "TensorBoardCallback",
    "TrackioCallback",
    "WandbCallback",
    "get_available_reporting_integrations",
    "get_reporting_integration_callbacks",
    "rewrite_logs",
]

# Upstream's table, same keys.
INTEGRATION_TO_CALLBACK: dict[str, type[TrainerCallback]] = {
    "azure_ml": AzureMLCallback,
    "comet_ml": CometCallback,
    "mlflow": MLflowCallback,
    "neptune": NeptuneCallback,
    "tensorboard": TensorBoardCallback,
    "trackio": TrackioCallback,
    "wandb": WandbCallback,
    "codecarbon": CodeCarbonCallback,
    "clearml": ClearMLCallback,
    "dagshub": DagsHubCallback,
    "flyte": FlyteCallback,
    "dvclive": DVCLiveCallback,
    "swanlab": SwanLabCallback,
    "kubeflow": KubeflowCallback,
}


def _needed_modules(name: str) -> list[str]:
    if name == "dagshub":
        return ["dagshub", "mlflow"]
    if name == "kubeflow":
        return []  # needs an environment, not a package: its callback says so
    return [TRACKERS[name].module]


def get_reporting_integration_callbacks(report_to: str | list[str] | None) -> list[type[TrainerCallback]]:
    """Map ``report_to`` names to callback classes (upstream's function).

    ``"all"`` selects :func:`get_available_reporting_integrations`, ``"none"``/``None``/``[]`` none. An unknown
    name raises ``ValueError`` listing the supported ones; names whose package is missing raise one
    :class:`MissingIntegrationError` naming each package and its pip command.
    """
    if report_to is None:
        return []
    names = [report_to] if isinstance(report_to, str) else list(report_to)
    if "none" in names:
        return []
    if "all" in names:
        names = get_available_reporting_integrations()
    unknown = [name for name in names if name not in INTEGRATION_TO_CALLBACK]
    if unknown:
        raise ValueError(
            f"report_to got unsupported integration(s) {unknown}; supported: "
            f"{sorted(INTEGRATION_TO_CALLBACK)} (or 'all' / 'none')."
        )
    names = list(dict.fromkeys(names))
    missing = [name for name in names if not all(is_installed(m) for m in _needed_modules(name))]
    if missing:
        raise missing_packages_error(missing)
    return [INTEGRATION_TO_CALLBACK[name] for name in names]
