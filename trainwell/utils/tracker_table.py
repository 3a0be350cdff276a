"""The experiment trackers ``report_to`` can name: ONE table, from which every list of tracker names is derived.

The ``report_to`` names and ``report_to="all"`` (:mod:`trainwell.utils.trackers`), the callbacks and upstream's
``INTEGRATION_TO_CALLBACK`` (:mod:`trainwell.callbacks.integrations`), the public names of ``trainwell`` and
``trainwell.callbacks`` (lazy exports) and the ``is_<tracker>_available`` checks of ``trainwell.integrations``
(:mod:`trainwell.compat.integrations`). Adding a tracker is one row here plus its callback module.

Pure data, no imports: ``import trainwell`` reads it to name its lazy exports.
"""

from __future__ import annotations


class Tracker:
    """One ``report_to`` name and everything trainwell derives from it (a plain class: cheaper to define at import
    than a NamedTuple or a dataclass)."""

    __slots__ = ("name", "callback", "callback_module", "module", "pip", "extra", "available", "available_if",
                 "requires", "alternative")

    def __init__(self, name: str, callback: str, callback_module: str, module: str, pip: str, extra: str | None,
                 available: str | None, *, available_if: str = "installed", requires: tuple[str, ...] | None = None,
                 alternative: str | None = None) -> None:
        self.name = name  # the report_to name (upstream's)
        self.callback = callback  # the callback class's name (upstream's), exported by trainwell and .integrations
        self.callback_module = callback_module  # the module under trainwell/callbacks/integrations/ defining it
        self.module = module  # the importable module whose presence means "installed"
        self.pip = pip  # what `pip install` needs
        self.extra = extra  # `pip install trainwell[extra]`, when trainwell has one
        self.available = available  # upstream's is_<tracker>_available (trainwell.integrations), or None
        # how that check answers: "installed" (every module the callback needs, or `alternative`) or "usable" (what
        # report_to="all" would pick: installed, enabled and able to run without a login)
        self.available_if = available_if
        self.requires = requires  # the modules the callback needs; None: (module,)
        self.alternative = alternative  # a module that also counts as installed for the is_*_available check

    def __repr__(self) -> str:
        return f"Tracker({self.name!r}, {self.callback!r})"


# Upstream's order of get_available_reporting_integrations(), then the names it accepts but never auto-selects.
TRACKER_TABLE: tuple[Tracker, ...] = (
    Tracker("azure_ml", "AzureMLCallback", "hosted", "azureml.core.run", "azureml-core", None,
            "is_azureml_available"),
    Tracker("comet_ml", "CometCallback", "comet", "comet_ml", "comet-ml", "comet_ml", "is_comet_available",
            available_if="usable"),
    Tracker("dagshub", "DagsHubCallback", "hosted", "dagshub", "dagshub mlflow", None, "is_dagshub_available",
            requires=("dagshub", "mlflow")),
    Tracker("dvclive", "DVCLiveCallback", "dvclive", "dvclive", "dvclive", "dvclive", "is_dvclive_available"),
    Tracker("mlflow", "MLflowCallback", "mlflow", "mlflow", "mlflow", "mlflow", "is_mlflow_available",
            available_if="usable"),
    Tracker("neptune", "NeptuneCallback", "neptune", "neptune", "neptune", "neptune", "is_neptune_available"),
    Tracker("tensorboard", "TensorBoardCallback", "tensorboard", "tensorboard", "tensorboard", "tensorboard",
            "is_tensorboard_available", alternative="tensorboardX"),
    Tracker("wandb", "WandbCallback", "wandb", "wandb", "wandb", "wandb", "is_wandb_available"),
    Tracker("codecarbon", "CodeCarbonCallback", "codecarbon", "codecarbon", "codecarbon", "codecarbon",
            "is_codecarbon_available"),
    Tracker("clearml", "ClearMLCallback", "clearml", "clearml", "clearml", "clearml", "is_clearml_available"),
    Tracker("swanlab", "SwanLabCallback", "swanlab", "swanlab", "swanlab", "swanlab", "is_swanlab_available"),
    Tracker("trackio", "TrackioCallback", "trackio", "trackio", "trackio", "trackio", "is_trackio_available"),
    # needs an environment (KUBEFLOW_TRAINER_SERVER_URL), not a package: its callback says so
    Tracker("kubeflow", "KubeflowCallback", "kubeflow", "kubeflow", "(none: set KUBEFLOW_TRAINER_SERVER_URL)", None,
            None, requires=()),
    Tracker("flyte", "FlyteCallback", "hosted", "flytekit", "flytekit flytekitplugins-deck-standard", None, None),
)


def needed_modules(tracker: Tracker) -> tuple[str, ...]:
    """The modules ``tracker``'s callback imports: ``requires``, else its ``module``."""
    return (tracker.module,) if tracker.requires is None else tracker.requires


def callback_exports(package: str) -> dict[str, str]:
    """``{callback class name: its module}``, the module relative to ``package`` (for :func:`lazy_exports`)."""
    prefix = {"trainwell": "callbacks.integrations.", "trainwell.callbacks": "integrations.",
              "trainwell.callbacks.integrations": ""}[package]
    return {t.callback: prefix + t.callback_module for t in TRACKER_TABLE}
