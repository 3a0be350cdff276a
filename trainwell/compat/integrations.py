"""The reporting integrations under upstream's module name: ``from trainwell.integrations import WandbCallback``.

Same names as ``transformers.integrations`` for the experiment trackers: the callbacks, ``INTEGRATION_TO_CALLBACK``,
``get_reporting_integration_callbacks``, ``get_available_reporting_integrations``, ``rewrite_logs`` and the
``is_<tracker>_available`` checks (none of which imports its package).
"""

from __future__ import annotations

from ..callbacks.integrations import (
    INTEGRATION_TO_CALLBACK,
    AzureMLCallback,
    ClearMLCallback,
    CodeCarbonCallback,
    CometCallback,
    DagsHubCallback,
    DVCLiveCallback,
    FlyteCallback,
    KubeflowCallback,
    MissingIntegrationError,
    MLflowCallback,
    NeptuneCallback,
    SwanLabCallback,
    TensorBoardCallback,
    TrackioCallback,
    WandbCallback,
    get_available_reporting_integrations,
    get_reporting_integration_callbacks,
    rewrite_logs,
)
from ..callbacks.integrations.neptune import NeptuneMissingConfiguration
from ..callbacks.integrations.wandb import WandbLogModel
from ..utils.trackers import is_installed

__all__ = [
    "INTEGRATION_TO_CALLBACK", "AzureMLCallback", "ClearMLCallback", "CodeCarbonCallback", "CometCallback",
    "DagsHubCallback", "DVCLiveCallback", "FlyteCallback", "KubeflowCallback", "MissingIntegrationError",
    "MLflowCallback", "NeptuneCallback", "NeptuneMissingConfiguration", "SwanLabCallback", "TensorBoardCallback",
    "TrackioCallback", "WandbCallback", "WandbLogModel", "get_available_reporting_integrations",
    "get_reporting_integration_callbacks", "rewrite_logs", "is_azureml_available", "is_clearml_available",
    "is_codecarbon_available", "is_comet_available", "is_dagshub_available", "is_dvclive_available",
    "is_mlflow_available", "is_neptune_available", "is_swanlab_available", "is_tensorboard_available",
    "is_trackio_available", "is_wandb_available",
]


def _available(name: str) -> bool:
    return name in get_available_reporting_integrations()


def is_wandb_available() -> bool:
    """wandb is installed."""
    return is_installed("wandb")


def is_comet_available() -> bool:
    """comet_ml is installed and configured (an API key or offline mode), as upstream requires."""
    return _available("comet_ml")


def is_mlflow_available() -> bool:
    """mlflow is installed and ``DISABLE_MLFLOW_INTEGRATION`` is not true."""
    return _available("mlflow")


def is_tensorboard_available() -> bool:
    """tensorboard (or tensorboardX) is installed."""
    return is_installed("tensorboard") or is_installed("tensorboardX")


def is_azureml_available() -> bool:
    """azureml-core is installed."""
    return is_installed("azureml") and is_installed("azureml.core.run")


def is_dagshub_available() -> bool:
    """dagshub and mlflow are installed."""
    return is_installed("dagshub") and is_installed("mlflow")


def is_neptune_available() -> bool:
    """neptune is installed."""
    return is_installed("neptune")


def is_clearml_available() -> bool:
    """clearml is installed."""
    return is_installed("clearml")


def is_codecarbon_available() -> bool:
    """codecarbon is installed."""
    return is_installed("codecarbon")


def is_dvclive_available() -> bool:
    """dvclive is installed."""
    return is_installed("dvclive")


def is_swanlab_available() -> bool:
    """swanlab is installed."""
    return is_installed("swanlab")


def is_trackio_available() -> bool:
    """trackio is installed."""
    return is_installed("trackio")
