"""The reporting integrations under upstream's module name: ``from trainwell.integrations import WandbCallback``.

Same names as ``transformers.integrations`` for the experiment trackers: the callbacks, ``INTEGRATION_TO_CALLBACK``,
``get_reporting_integration_callbacks``, ``get_available_reporting_integrations``, ``rewrite_logs`` and the
``is_<tracker>_available`` checks (none of which imports its package).
"""

from __future__ import annotations

from typing import Callable

from ..callbacks import integrations as _integrations
from ..callbacks.integrations import (
    INTEGRATION_TO_CALLBACK,
    MissingIntegrationError,
    get_available_reporting_integrations,
    get_reporting_integration_callbacks,
    rewrite_logs,
)
from ..callbacks.integrations.neptune import NeptuneMissingConfiguration
from ..callbacks.integrations.wandb import WandbLogModel
from ..utils.tracker_table import TRACKER_TABLE, Tracker, needed_modules
from ..utils.trackers import is_installed


def _availability_check(tracker: Tracker) -> Callable[[], bool]:
    """Upstream's ``is_<tracker>_available`` for one row of the table (imports no tracker package)."""
    if tracker.available_if == "usable":
        def check() -> bool:
            return tracker.name in get_available_reporting_integrations()

        check.__doc__ = f"{tracker.module} is installed and would be picked by report_to='all' (as upstream)."
    else:
        def check() -> bool:
            installed = all(is_installed(module) for module in needed_modules(tracker))
            return installed or (tracker.alternative is not None and is_installed(tracker.alternative))

        check.__doc__ = f"{' and '.join(needed_modules(tracker))} installed" + (
            f" (or {tracker.alternative})." if tracker.alternative else ".")
    check.__name__ = check.__qualname__ = str(tracker.available)
    return check


def is_optuna_available() -> bool:
    """optuna installed (the hyperparameter-search backend ``backend="optuna"``)."""
    return is_installed("optuna")


def is_ray_available() -> bool:
    """ray installed."""
    return is_installed("ray")


def is_ray_tune_available() -> bool:
    """ray and its ``ray.tune`` installed (the hyperparameter-search backend ``backend="ray"``)."""
    return is_ray_available() and is_installed("ray.tune")


# The callbacks (each module imported now, as upstream's module does) and the is_*_available checks, by table row.
globals().update({t.callback: getattr(_integrations, t.callback) for t in TRACKER_TABLE})
globals().update({t.available: _availability_check(t) for t in TRACKER_TABLE if t.available})

__all__ = sorted([
    "INTEGRATION_TO_CALLBACK", "MissingIntegrationError", "NeptuneMissingConfiguration", "WandbLogModel",
    "get_available_reporting_integrations", "get_reporting_integration_callbacks", "rewrite_logs",
    "is_optuna_available", "is_ray_available", "is_ray_tune_available",
    *(t.callback for t in TRACKER_TABLE), *(t.available for t in TRACKER_TABLE if t.available),
])
