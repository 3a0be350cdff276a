"""Reporting integrations (``report_to``): name -> callback class, with lazy imports of the packages."""

from __future__ import annotations

import importlib.util

from ..base import TrainerCallback
from .mlflow import MLflowCallback
from .tensorboard import TensorBoardCallback, rewrite_logs

__all__ = [
    "INTEGRATION_TO_CALLBACK",
    "MLflowCallback",
    "TensorBoardCallback",
    "get_available_reporting_integrations",
    "get_reporting_integration_callbacks",
    "rewrite_logs",
]

INTEGRATION_TO_CALLBACK: dict[str, type[TrainerCallback]] = {
    "tensorboard": TensorBoardCallback,
    "mlflow": MLflowCallback,
}

# The package each integration needs; checked with find_spec so nothing is imported.
_REQUIRED_PACKAGE = {"tensorboard": "tensorboard", "mlflow": "mlflow"}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def get_available_reporting_integrations() -> list[str]:
    """The integration names whose package is installed (what ``report_to='all'`` selects)."""
    return [name for name, package in _REQUIRED_PACKAGE.items() if _installed(package)]


def get_reporting_integration_callbacks(report_to: str | list[str] | None) -> list[type[TrainerCallback]]:
    """Map ``report_to`` names to callback classes.

    ``"all"`` selects every installed integration, ``"none"``/``None``/``[]`` none. An unknown name
    raises ``ValueError`` listing the supported ones.
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
    return [INTEGRATION_TO_CALLBACK[name] for name in dict.fromkeys(names)]
