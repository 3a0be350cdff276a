"""Helpers shared by the tracker callbacks: package checks, environment flags, what a run's config is."""

from __future__ import annotations

import importlib
import os
from typing import Any

from ...utils.trackers import TRACKERS, is_installed, missing_packages_error
from .tensorboard import as_scalar

__all__ = ["SINGLE_VALUE_SCALARS", "check_installed", "env_flag", "require", "run_config", "flatten", "scalar_logs"]

_TRUE = {"1", "ON", "YES", "TRUE", "Y"}

# End-of-training values that trackers with a run summary store once instead of as a series (upstream's list).
SINGLE_VALUE_SCALARS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                        "total_flos")


def env_flag(name: str, default: str = "FALSE") -> bool:
    """An upstream-style boolean environment variable (``1``/``true``/``yes``/``on``, any case)."""
    return os.getenv(name, default).strip().upper() in _TRUE


def require(name: str) -> Any:
    """Import the package of the ``report_to`` integration ``name``, or raise one error naming the pip command."""
    tracker = TRACKERS[name]
    if not is_installed(tracker.module):
        raise missing_packages_error([name])
    return importlib.import_module(tracker.module)


def check_installed(name: str) -> None:
    """Raise the missing-package error for ``name`` now (at Trainer construction) without importing anything."""
    if not is_installed(TRACKERS[name].module):
        raise missing_packages_error([name])


def flatten(data: dict[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Nested dicts as ``a.b`` keys."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + sep, sep))
        else:
            flat[name] = value
    return flat


def _args_dict(args: Any) -> dict[str, Any]:
    if hasattr(args, "to_dict"):
        return dict(args.to_dict())
    if hasattr(args, "to_sanitized_dict"):
        return dict(args.to_sanitized_dict())
    return dict(vars(args))


def run_config(args: Any, model: Any) -> dict[str, Any]:
    """A run's config as upstream logs it: the model config (when it has one) overlaid with the arguments."""
    params = _args_dict(args)
    config = getattr(model, "config", None)
    if isinstance(config, dict):
        params = {**config, **params}
    elif config is not None and hasattr(config, "to_dict"):
        params = {**config.to_dict(), **params}
    return params


def scalar_logs(logs: dict[str, Any]) -> tuple[dict[str, float], list[str]]:
    """The real-number entries of ``logs`` (tensors of one element included) and the names of the others."""
    numbers: dict[str, float] = {}
    dropped: list[str] = []
    for key, value in logs.items():
        scalar = as_scalar(value)
        if scalar is None:
            dropped.append(key)
        else:
            numbers[key] = scalar
    return numbers, dropped
