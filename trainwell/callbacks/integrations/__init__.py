"""Reporting integrations (``report_to``): name -> callback class; each imports its package only when used.

Every name upstream accepts has a callback here. Building the Trainer builds the callbacks, and a callback whose
package is missing raises :class:`~trainwell.utils.trackers.MissingIntegrationError` (one error naming every missing
package and the pip command) before anything else happens.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from ...utils.lazy_exports import lazy_exports
from ...utils.trackers import (
    TRACKERS,
    MissingIntegrationError,
    get_available_reporting_integrations,
    is_installed,
    missing_packages_error,
)
from ..base import TrainerCallback

# Each public name -> its module, imported on first use (a Trainer loads only what report_to names).
CALLBACK_MODULES: dict[str, str] = {
    "AzureMLCallback": "hosted",
    "ClearMLCallback": "clearml",
    "CodeCarbonCallback": "codecarbon",
    "CometCallback": "comet",
    "DagsHubCallback": "hosted",
    "DVCLiveCallback": "dvclive",
    "FlyteCallback": "hosted",
    "KubeflowCallback": "hosted",
    "MLflowCallback": "mlflow",
    "NeptuneCallback": "neptune",
    "SwanLabCallback": "swanlab",
    "TensorBoardCallback": "tensorboard",
    "TrackioCallback": "trackio",
    "WandbCallback": "wandb",
    "rewrite_logs": "tensorboard",
}

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

# Upstream's table, same keys: report_to name -> the callback class's name (see INTEGRATION_TO_CALLBACK).
_INTEGRATION_NAMES: dict[str, str] = {
    "azure_ml": "AzureMLCallback",
    "comet_ml": "CometCallback",
    "mlflow": "MLflowCallback",
    "neptune": "NeptuneCallback",
    "tensorboard": "TensorBoardCallback",
    "trackio": "TrackioCallback",
    "wandb": "WandbCallback",
    "codecarbon": "CodeCarbonCallback",
    "clearml": "ClearMLCallback",
    "dagshub": "DagsHubCallback",
    "flyte": "FlyteCallback",
    "dvclive": "DVCLiveCallback",
    "swanlab": "SwanLabCallback",
    "kubeflow": "KubeflowCallback",
}

_lazy_getattr, __dir__ = lazy_exports(__name__, CALLBACK_MODULES)


def _callback_class(name: str) -> type[TrainerCallback]:
    """The callback class of the ``report_to`` name ``name`` (its module imported now)."""
    cls_name = _INTEGRATION_NAMES[name]
    return getattr(import_module(f".{CALLBACK_MODULES[cls_name]}", __name__), cls_name)


def __getattr__(name: str) -> Any:
    if name == "INTEGRATION_TO_CALLBACK":  # upstream's name -> class table: every integration module is imported
        table = {key: _callback_class(key) for key in _INTEGRATION_NAMES}
        globals()[name] = table
        return table
    return _lazy_getattr(name)


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
    unknown = [name for name in names if name not in _INTEGRATION_NAMES]
    if unknown:
        raise ValueError(
            f"report_to got unsupported integration(s) {unknown}; supported: "
            f"{sorted(_INTEGRATION_NAMES)} (or 'all' / 'none')."
        )
    names = list(dict.fromkeys(names))
    missing = [name for name in names if not all(is_installed(m) for m in _needed_modules(name))]
    if missing:
        raise missing_packages_error(missing)
    return [_callback_class(name) for name in names]
