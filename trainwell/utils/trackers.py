"""``report_to`` names: the package each integration needs, and which ones are installed and usable.

The trackers themselves are the rows of :data:`~trainwell.utils.tracker_table.TRACKER_TABLE`; this module answers
for ``TrainingArguments`` (name validation, ``report_to="all"``) and for the callbacks (``callbacks/integrations``).
Nothing here imports a tracker package: presence is checked with ``find_spec`` and whether a tracker can run (credentials or an offline/local mode) with its documented environment variables and
config files only, so that building the arguments stays cheap.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from .tracker_table import TRACKER_TABLE, Tracker

__all__ = [
    "REPORT_TO_INTEGRATIONS",
    "Tracker",
    "TRACKERS",
    "MissingIntegrationError",
    "get_available_reporting_integrations",
    "is_installed",
    "is_kubeflow_available",
    "missing_packages_error",
]

logger = logging.getLogger(__name__)

_TRUE = {"1", "ON", "YES", "TRUE", "Y"}


# report_to name -> its row of the table, in upstream's order.
TRACKERS: dict[str, Tracker] = {t.name: t for t in TRACKER_TABLE}

# report_to name -> module whose presence means the integration is installed (kept for TrainingArguments).
REPORT_TO_INTEGRATIONS: dict[str, str] = {name: t.module for name, t in TRACKERS.items()}


class MissingIntegrationError(ImportError, RuntimeError):
    """A ``report_to`` integration whose package is not installed.

    An ``ImportError`` (trainwell's convention for optional packages) and a ``RuntimeError`` (what upstream's
    callbacks raise), so ``except`` clauses written for either keep working.
    """


def _env(name: str, default: str = "") -> str:
    return os.getenv(name, default).strip()


def _env_true(name: str) -> bool:
    return _env(name).upper() in _TRUE


def is_installed(module: str) -> bool:
    """Whether ``module`` (dotted names allowed) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def missing_packages_error(names: list[str]) -> MissingIntegrationError:
    """One error naming every integration in ``names`` whose package is missing, with the pip command."""
    lines = []
    for name in names:
        tracker = TRACKERS[name]
        how = f"`pip install {tracker.pip}`"
        if tracker.extra:
            how = f"`pip install trainwell[{tracker.extra}]` (or {how})"
        lines.append(f"report_to='{name}' needs the `{tracker.module.split('.')[0]}` package: {how}")
    plural = "s" if len(names) > 1 else ""
    return MissingIntegrationError(
        f"Missing package{plural} for the reporting integration{plural} {names}:\n  " + "\n  ".join(lines)
        + f"\nInstall {'them' if plural else 'it'}, or remove the name{plural} from report_to."
    )


def _file_mentions(path: str | Path, text: str) -> bool:
    try:
        return text in Path(path).expanduser().read_text(errors="ignore")
    except OSError:
        return False


# Whether a tracker can run without asking for a login: an offline/local mode, or credentials it documents.
def _wandb_usable() -> bool:
    if _env_true("WANDB_DISABLED"):
        return False
    mode = _env("WANDB_MODE").lower()
    return (mode in {"offline", "dryrun", "disabled"} or bool(_env("WANDB_API_KEY"))
            or _file_mentions(os.getenv("NETRC", "~/.netrc"), "api.wandb.ai"))


def _comet_usable() -> bool:
    offline = _env("COMET_MODE").lower() == "offline" or _env("COMET_START_ONLINE").upper() in {"0", "FALSE", "NO"}
    return offline or bool(_env("COMET_API_KEY")) or any(
        _file_mentions(p, "api_key") for p in (_env("COMET_CONFIG") or "~/.comet.config", "./.comet.config"))


def _neptune_usable() -> bool:
    return _env("NEPTUNE_MODE").lower() in {"offline", "debug"} or bool(_env("NEPTUNE_API_TOKEN"))


def _clearml_usable() -> bool:
    return (_env_true("CLEARML_OFFLINE_MODE") or bool(_env("CLEARML_API_ACCESS_KEY"))
            or bool(_env("CLEARML_CONFIG_FILE")) or Path("~/clearml.conf").expanduser().is_file())


def _swanlab_usable() -> bool:
    return _env("SWANLAB_MODE").lower() in {"offline", "local", "disabled"} or bool(_env("SWANLAB_API_KEY"))


def is_kubeflow_available() -> bool:
    """Whether this process runs inside a Kubeflow TrainJob that takes progress reports (upstream's rule:
    ``KUBEFLOW_TRAINER_SERVER_URL`` set and ``DISABLE_KUBEFLOW_INTEGRATION`` not true)."""
    if os.getenv("DISABLE_KUBEFLOW_INTEGRATION", "FALSE").upper() == "TRUE":
        return False
    return os.getenv("KUBEFLOW_TRAINER_SERVER_URL") is not None


def _usable(name: str) -> bool:
    """Installed, not disabled, and able to run here (see the module docstring)."""
    if name == "azure_ml":  # upstream: AzureML only when MLflow is absent (AzureML logs through MLflow then)
        return is_installed("azureml") and is_installed("azureml.core.run") and not _usable("mlflow")
    if name == "mlflow":
        return not _env_true("DISABLE_MLFLOW_INTEGRATION") and is_installed("mlflow")
    if name == "dagshub":
        return is_installed("dagshub") and is_installed("mlflow") and bool(_env("DAGSHUB_USER_TOKEN"))
    if name == "kubeflow":
        return is_kubeflow_available()
    if name == "flyte":
        return False  # upstream never selects Flyte for "all": it needs a Flyte task context
    if not is_installed(TRACKERS[name].module):
        return False
    check = {"wandb": _wandb_usable, "comet_ml": _comet_usable, "neptune": _neptune_usable,
             "clearml": _clearml_usable, "swanlab": _swanlab_usable}.get(name)
    if check is not None and not check():
        logger.info("report_to='all' leaves out %s: it is installed but has no credentials and no offline mode "
                    "set (see its section in the README).", name)
        return False
    return True


def get_available_reporting_integrations() -> list[str]:
    """The integrations ``report_to="all"`` selects: installed, and able to run without an interactive login.

    Same order as upstream. Trackers that need a login (W&B, Comet, Neptune, ClearML, SwanLab) count only with
    credentials or an offline mode set in the environment, so that ``"all"`` never stops a run to ask for one.
    """
    return [name for name in TRACKERS if _usable(name)]
