"""The one table of experiment trackers (trainwell/utils/tracker_table.py): every list of tracker names is derived from
it and equals the lists trainwell exported before the table (and upstream's names)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainwell
import trainwell.callbacks as callbacks
import trainwell.callbacks.integrations as integrations
import trainwell.compat.integrations as compat_integrations
from trainwell.utils.tracker_table import TRACKER_TABLE, needed_modules
from trainwell.utils.trackers import REPORT_TO_INTEGRATIONS, TRACKERS

PACKAGE = Path(trainwell.__file__).parent

# The lists as they were written out by hand before the table (five places), kept here as the oracle.
CALLBACKS = ["AzureMLCallback", "ClearMLCallback", "CodeCarbonCallback", "CometCallback", "DagsHubCallback",
             "DVCLiveCallback", "FlyteCallback", "KubeflowCallback", "MLflowCallback", "NeptuneCallback",
             "SwanLabCallback", "TensorBoardCallback", "TrackioCallback", "WandbCallback"]
REPORT_TO = ["azure_ml", "comet_ml", "dagshub", "dvclive", "mlflow", "neptune", "tensorboard", "wandb", "codecarbon",
             "clearml", "swanlab", "trackio", "kubeflow", "flyte"]
AVAILABLE = ["is_azureml_available", "is_clearml_available", "is_codecarbon_available", "is_comet_available",
             "is_dagshub_available", "is_dvclive_available", "is_mlflow_available", "is_neptune_available",
             "is_swanlab_available", "is_tensorboard_available", "is_trackio_available", "is_wandb_available"]
OTHER_CALLBACK_NAMES = ["DefaultFlowCallback", "EarlyStoppingCallback", "ExportableState", "PrinterCallback",
                        "ProgressCallback", "StopOnNonFiniteLossCallback", "TrainerCallback", "TrainerControl",
                        "TrainerState", "get_available_reporting_integrations", "get_reporting_integration_callbacks"]


def test_report_to_names_are_the_rows_in_upstreams_order():
    assert [t.name for t in TRACKER_TABLE] == REPORT_TO == list(TRACKERS) == list(REPORT_TO_INTEGRATIONS)


def test_public_callback_names_are_derived_from_the_table():
    assert sorted(t.callback for t in TRACKER_TABLE) == sorted(CALLBACKS)
    assert set(CALLBACKS) <= set(trainwell.__all__)
    assert sorted(callbacks.__all__) == sorted(CALLBACKS + OTHER_CALLBACK_NAMES)
    assert set(CALLBACKS) <= set(integrations.__all__) and set(CALLBACKS) <= set(compat_integrations.__all__)
    for name in CALLBACKS:  # the same class under every public path
        cls = getattr(trainwell, name)
        assert cls.__name__ == name
        assert getattr(callbacks, name) is cls is getattr(integrations, name) is getattr(compat_integrations, name)
    assert {name: cls.__name__ for name, cls in integrations.INTEGRATION_TO_CALLBACK.items()} == {
        t.name: t.callback for t in TRACKER_TABLE}


def test_is_available_names_are_derived_from_the_table():
    assert sorted(t.available for t in TRACKER_TABLE if t.available) == AVAILABLE
    assert set(AVAILABLE) <= set(compat_integrations.__all__)
    for name in AVAILABLE:
        check = getattr(compat_integrations, name)
        assert check.__name__ == name and check.__doc__


def test_names_are_upstreams():
    upstream = pytest.importorskip("transformers.integrations")
    assert sorted(upstream.INTEGRATION_TO_CALLBACK) == sorted(REPORT_TO)
    for name in CALLBACKS + AVAILABLE:
        assert hasattr(upstream, name), name


def test_every_row_names_a_module_that_defines_its_callback():
    for tracker in TRACKER_TABLE:
        path = PACKAGE / "callbacks" / "integrations" / f"{tracker.callback_module}.py"
        classes = {node.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)}
        assert tracker.callback in classes, f"{tracker.callback} is not defined in {path.name}"


def test_is_available_checks_answer_from_the_rows(monkeypatch):
    """With a fake set of installed modules, each installed-kind check answers from its row's modules."""
    installed = {"wandb", "dagshub", "tensorboardX", "azureml.core.run"}
    monkeypatch.setattr(compat_integrations, "is_installed", lambda module: module in installed)
    answers = {t.available: getattr(compat_integrations, t.available)() for t in TRACKER_TABLE
               if t.available and t.available_if == "installed"}
    assert answers == {
        "is_azureml_available": True, "is_dagshub_available": False,  # dagshub needs mlflow too
        "is_dvclive_available": False, "is_neptune_available": False,
        "is_tensorboard_available": True,  # tensorboardX counts, as upstream
        "is_wandb_available": True, "is_codecarbon_available": False, "is_clearml_available": False,
        "is_swanlab_available": False, "is_trackio_available": False,
    }
    assert needed_modules(TRACKERS["kubeflow"]) == () and needed_modules(TRACKERS["dagshub"]) == ("dagshub", "mlflow")


def test_usable_kind_checks_follow_report_to_all(monkeypatch):
    monkeypatch.setattr(compat_integrations, "get_available_reporting_integrations", lambda: ["mlflow"])
    assert compat_integrations.is_mlflow_available() is True
    assert compat_integrations.is_comet_available() is False


@pytest.mark.slow
def test_import_trainwell_reads_no_table_until_a_tracker_name_is_asked_for():
    """``import trainwell`` stays at three modules; ``__all__``, ``dir`` and ``import *`` still list the callbacks."""
    code = ("import sys; import trainwell; loaded = sorted(m for m in sys.modules if m.startswith('trainwell')); "
            "ns = {}; exec('from trainwell import *', ns); "
            "print(loaded, 'WandbCallback' in trainwell.__all__, 'DVCLiveCallback' in ns, 'FlyteCallback' in dir(trainwell))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120, env=env)
    assert out.stdout.strip() == "['trainwell', 'trainwell.utils', 'trainwell.utils.lazy_exports'] True True True"
