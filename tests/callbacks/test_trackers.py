"""Each experiment tracker for real, offline: train a tiny model with ``report_to=<tracker>`` and read back what was
logged (metrics per step, the config, the run name, artifacts where the tracker has them) with the tracker's own
reader or from its own files. A test is skipped when its package is not installed (``pip install trainwell[test]``
installs them)."""

from __future__ import annotations

import csv
import json
import math
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from helpers.launch import ROOT
from trainwell import Trainer, TrainingArguments

pytestmark = pytest.mark.slow  # each tracker's own package, started for real: over a second a test

RUN_NAME = "tw-run"
LR = 0.05


class TinyConfig:
    """A model config the trackers log (like a transformers ``PretrainedConfig``)."""

    def __init__(self, hidden_size: int = 2) -> None:
        self.hidden_size = hidden_size

    def to_dict(self) -> dict[str, Any]:
        return {"hidden_size": self.hidden_size, "model_type": "tiny-regression"}

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict())


def train(tiny: Any, tmp_path: Path, report_to: str, *, evaluate: bool = False, **overrides: Any
          ) -> tuple[Trainer, dict[int, float]]:
    """Four optimizer steps (one log each), optionally an evaluation; returns the trainer and {step: loss}."""
    model = tiny.RegressionModel()
    model.config = TinyConfig()
    options: dict[str, Any] = dict(output_dir=str(tmp_path / "out"), report_to=report_to, run_name=RUN_NAME,
                                   max_steps=4, logging_steps=1, per_device_train_batch_size=4, learning_rate=LR,
                                   save_strategy="no", disable_tqdm=True, use_cpu=True, seed=0,
                                   dataloader_pin_memory=False)
    options.update(overrides)
    trainer = Trainer(model=model, args=TrainingArguments(**options), train_dataset=tiny.regression_data(16),
                      eval_dataset=tiny.regression_data(8, seed=1))
    trainer.train()
    if evaluate:
        trainer.evaluate()
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    assert sorted(losses) == [1, 2, 3, 4]
    return trainer, losses


def train_in_child(tmp_path: Path, report_to: str, read_back: str, env: dict[str, str]) -> dict[str, Any]:
    """``train`` in a fresh interpreter (for trackers that fix their storage folder when imported), then
    ``read_back`` (code setting ``result``) there; returns ``{"losses": {step: loss}, "result": result}``."""
    script = textwrap.dedent("""
        import json, sys
        from pathlib import Path
        from types import SimpleNamespace
        sys.path[:0] = [HERE, TESTS]
        import helpers
        from test_trackers import train
        tiny = SimpleNamespace(RegressionModel=helpers.RegressionModel, regression_data=helpers.regression_data)
        import os
        options = json.loads(os.environ.get("TW_TRAIN_OPTIONS", "{}"))
        trainer, losses = train(tiny, Path(TMP), REPORT_TO, evaluate=True, **options)
        result = None
    """) + textwrap.dedent(read_back) + "\nprint('RESULT=' + json.dumps({'losses': losses, 'result': result}))\n"
    script = (script.replace("HERE", repr(str(Path(__file__).parent))).replace("TESTS", repr(str(ROOT / "tests")))
              .replace("TMP", repr(str(tmp_path))).replace("REPORT_TO", repr(report_to)))
    child_env = {**os.environ, **env, "OMP_NUM_THREADS": "1",
                 "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # output to a file, not a pipe: helper processes a tracker leaves behind (ClearML's reporter) would hold a pipe
    # open for minutes after the child ended
    log = tmp_path / "child.log"
    with open(log, "w") as fh:
        code = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=child_env, stdout=fh,
                              stderr=subprocess.STDOUT, timeout=600).returncode
    output = log.read_text(errors="replace")
    lines = [line for line in output.splitlines() if line.startswith("RESULT=")]
    assert code == 0 and lines, output[-5000:]
    payload = json.loads(lines[-1][len("RESULT="):])
    payload["losses"] = {int(k): v for k, v in payload["losses"].items()}
    return payload


def assert_losses(logged: dict[int, float], expected: dict[int, float]) -> None:
    assert sorted(logged) == sorted(expected), (logged, expected)
    for step, value in expected.items():
        assert math.isclose(logged[step], value, rel_tol=1e-6), (step, logged[step], value)


# ------------------------------------------------------------------------------------------------ TensorBoard
def test_tensorboard(tiny, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, losses = train(tiny, tmp_path, "tensorboard", evaluate=True, logging_dir=str(tmp_path / "tb"))
    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0, "tensors": 0}).Reload()
    assert_losses({e.step: e.value for e in events.Scalars("train/loss")}, losses)
    assert [e.step for e in events.Scalars("eval/loss")] == [4]
    args_text = events.Tensors("args/text_summary")[0].tensor_proto.string_val[0].decode()
    assert f'"learning_rate": {LR}' in args_text and f'"run_name": "{RUN_NAME}"' in args_text
    assert "tiny-regression" in events.Tensors("model_config/text_summary")[0].tensor_proto.string_val[0].decode()


# ------------------------------------------------------------------------------------------------ MLflow
def test_mlflow(tiny, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # mlflow 3's store; artifacts go to ./mlartifacts
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "tw-exp")
    monkeypatch.setenv("HF_MLFLOW_LOG_ARTIFACTS", "1")
    monkeypatch.setenv("MLFLOW_TAGS", json.dumps({"team": "trainwell"}))
    trainer, losses = train(tiny, tmp_path, "mlflow", save_strategy="steps", save_steps=2)
    assert mlflow.active_run() is None  # the callback ended the run it started
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("tw-exp")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == RUN_NAME and run.data.tags["team"] == "trainwell"
    assert run.data.params["learning_rate"] == str(LR) and run.data.params["hidden_size"] == "2"
    assert_losses({m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}, losses)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"checkpoint-2", "checkpoint-4"} <= artifacts
    assert "model.safetensors" in {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "checkpoint-4")}



def test_mlflow_flatten_params(tmp_path, monkeypatch):
    """``MLFLOW_FLATTEN_PARAMS``: nested values become ``a.b`` parameters (upstream's ``flatten_dict``)."""
    pytest.importorskip("mlflow")
    import mlflow
    from mlflow.tracking import MlflowClient

    from trainwell.integrations import MLflowCallback

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_FLATTEN_PARAMS", "1")
    callback = MLflowCallback()
    callback._ml_flow = mlflow
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        with mlflow.start_run(experiment_id="0") as run:  # the store's default experiment
            callback._log_params({"a": {"b": 1, "c": {"d": "x"}}, "e": 3})
    finally:
        mlflow.set_tracking_uri(before)
    params = MlflowClient(tracking_uri=uri).get_run(run.info.run_id).data.params
    assert params == {"a.b": "1", "a.c.d": "x", "e": "3"}


# ------------------------------------------------------------------------------------------------ W&B
def _wandb_records(run_dir: Path) -> list[Any]:
    """The records of an offline run's ``.wandb`` file, parsed with wandb's own protobuf ``Record``.

    The file is wandb's LevelDB-style log: a 7-byte header, then 32 KiB blocks of chunks (crc32 4, length 2,
    type 1: full/first/middle/last).
    """
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # the rest of a block too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


WANDB_READ_BACK = """
    import wandb
    result = str(Path(wandb.run.dir).parent)
    wandb.finish()
"""


def _wandb_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {name: str(tmp_path / "wandb-home") for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR",
                                                           "WANDB_DATA_DIR")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLED="false", **extra)
    return env


@pytest.mark.slow
def test_wandb_offline(tmp_path):
    """In a child process: wandb keeps its settings per process, and its log is complete once the process ended."""
    pytest.importorskip("wandb")
    out = train_in_child(tmp_path, "wandb", WANDB_READ_BACK,
                         _wandb_env(tmp_path, WANDB_PROJECT="tw-proj", WANDB_LOG_MODEL="end"))
    losses, records = out["losses"], _wandb_records(Path(out["result"]))
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert len(runs) == 1, [r.WhichOneof("record_type") for r in records][:40]
    run = runs[0]
    assert run.display_name == RUN_NAME and run.project == "tw-proj"
    config = {item.key: json.loads(item.value_json) for r in records if r.WhichOneof("record_type") == "config"
              for item in r.config.update}
    config.update({item.key: json.loads(item.value_json) for item in run.config.update})
    assert config["learning_rate"] == LR and config["hidden_size"] == 2 and config["run_name"] == RUN_NAME
    assert config["model/num_parameters"] == 3
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert_losses({h["train/global_step"]: h["train/loss"] for h in history if "train/loss" in h}, losses)
    assert [h["train/global_step"] for h in history if "eval/loss" in h] == [4]
    summary = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update}
    assert "train_runtime" in summary and "train/train_runtime" not in summary
    artifacts = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert [a.type for a in artifacts] == ["model"] and artifacts[0].name == f"model-{RUN_NAME}"
    assert "model.safetensors" in {entry.path for entry in artifacts[0].manifest.contents}


@pytest.mark.slow
def test_wandb_log_model_checkpoint(tmp_path):
    pytest.importorskip("wandb")
    out = train_in_child(tmp_path, "wandb", WANDB_READ_BACK, _wandb_env(
        tmp_path, WANDB_LOG_MODEL="checkpoint", WANDB_WATCH="gradients", TW_TRAIN_OPTIONS='{"save_strategy": "steps", '
        '"save_steps": 2}'))
    artifacts = [r.artifact for r in _wandb_records(Path(out["result"])) if r.WhichOneof("record_type") == "artifact"]
    # one per checkpoint (steps 2 and 4), then the final model
    assert [a.name for a in artifacts] == [f"model-{RUN_NAME}"] * 3
    assert all("model.safetensors" in {e.path for e in a.manifest.contents} for a in artifacts)
    assert sum("trainer_state.json" in {e.path for e in a.manifest.contents} for a in artifacts) == 2


def test_wandb_disabled_logs_nothing(tiny, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-home"))
    monkeypatch.chdir(tmp_path)
    train(tiny, tmp_path, "wandb")
    assert not (tmp_path / "wandb-home").exists() and not (tmp_path / "wandb").exists()


# ------------------------------------------------------------------------------------------------ Comet
def test_comet_offline(tiny, tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_MODE", "offline")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_PROJECT_NAME", "tw-proj")
    monkeypatch.setenv("COMET_AUTO_LOG_CO2", "false")
    monkeypatch.setenv("COMET_AUTO_LOG_GIT_METADATA", "false")
    monkeypatch.setenv("COMET_AUTO_LOG_ENV_DETAILS", "false")
    monkeypatch.setenv("COMET_ERROR_TRACKING_ENABLE", "false")  # no network: no error reports
    trainer, losses = train(tiny, tmp_path, "comet_ml")
    import comet_ml

    comet_ml.get_running_experiment().end()
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as zf:
        meta = json.loads(zf.read("experiment.json"))
        messages = [json.loads(line) for line in zf.read("messages.json").decode().splitlines() if line.strip()]
    assert meta["project_name"] == "tw-proj"
    names = [m["payload"]["value"] for m in messages if m["type"] == "log_other" and m["payload"]["key"] == "Name"]
    params = {p["paramName"]: p["paramValue"] for m in messages if m["type"] == "parameter_msg"
              for p in [m["payload"].get("param") or m["payload"]["params"]]}
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    assert names == [RUN_NAME]
    assert float(params["args|learning_rate"]) == LR and params["config|hidden_size"] in ("2", 2)
    assert_losses({m["step"]: float(m["metricValue"]) for m in metrics if m["metricName"] == "train/loss"}, losses)


# ------------------------------------------------------------------------------------------------ DVCLive
def test_dvclive(tiny, tmp_path, monkeypatch):
    pytest.importorskip("dvclive")
    import yaml

    monkeypatch.chdir(tmp_path)  # Live() writes ./dvclive
    monkeypatch.setenv("HF_DVCLIVE_LOG_MODEL", "true")
    monkeypatch.setenv("DVCLIVE_LOGLEVEL", "ERROR")
    trainer, losses = train(tiny, tmp_path, "dvclive")
    params = yaml.safe_load((tmp_path / "dvclive" / "params.yaml").read_text())
    assert params["learning_rate"] == LR and params["run_name"] == RUN_NAME
    with open(tmp_path / "dvclive" / "plots" / "metrics" / "loss.tsv") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    # one DVCLive step per log, counted from 0
    assert_losses({int(r["step"]) + 1: float(r["loss"]) for r in rows}, losses)
    summary = json.loads((tmp_path / "dvclive" / "metrics.json").read_text())
    assert summary["step"] == 4 and math.isclose(summary["train"]["loss"], trainer.state.log_history[-1]["train_loss"])
    assert (tmp_path / "out" / "last" / "model.safetensors").is_file()  # HF_DVCLIVE_LOG_MODEL: the final model


# ------------------------------------------------------------------------------------------------ CodeCarbon
def test_codecarbon(tiny, tmp_path, monkeypatch):
    pytest.importorskip("codecarbon")
    monkeypatch.setenv("CODECARBON_LOG_LEVEL", "error")
    monkeypatch.setenv("CODECARBON_SAVE_TO_API", "false")
    monkeypatch.chdir(tmp_path)
    train(tiny, tmp_path, "codecarbon")
    with open(tmp_path / "out" / "emissions.csv") as fh:
        (row,) = list(csv.DictReader(fh))
    assert float(row["duration"]) > 0 and float(row["emissions"]) >= 0 and float(row["energy_consumed"]) >= 0


# ------------------------------------------------------------------------------------------------ ClearML
@pytest.mark.slow
def test_clearml_offline(tmp_path):
    pytest.importorskip("clearml")
    read_back = """
        from clearml import Task
        result = {"offline": Task.is_offline()}
    """
    out = train_in_child(tmp_path, "clearml", read_back, {
        "CLEARML_OFFLINE_MODE": "1", "CLEARML_CACHE_DIR": str(tmp_path / "clearml-cache"), "HOME": str(tmp_path),
        "CLEARML_PROJECT": "tw-proj", "CLEARML_TASK": RUN_NAME, "CLEARML_LOG_MODEL": "false"})
    assert out["result"]["offline"]  # CLEARML_OFFLINE_MODE: nothing left this machine
    losses = out["losses"]
    (session,) = [p for p in (tmp_path / "clearml-cache").rglob("offline-*") if p.is_dir()]
    task = json.loads((session / "task.json").read_text())
    assert task["name"] == RUN_NAME and task["project_name"] == "tw-proj"
    hparams = task["hyperparams"]["Transformers"]
    assert float(hparams["learning_rate"]["value"]) == LR and hparams["run_name"]["value"] == RUN_NAME
    events = [e for line in (session / "metrics.jsonl").read_text().splitlines() for e in json.loads(line)]
    scalars = [e for e in events if e["type"] == "training_stats_scalar"]
    assert_losses({e["iter"]: e["value"] for e in scalars if (e["metric"], e["variant"]) == ("train", "loss")},
                  losses)
    assert {"train_runtime", "train_loss"} <= {e["variant"] for e in scalars if e["metric"] == "Summary"}


# ------------------------------------------------------------------------------------------------ Neptune
def test_neptune_offline(tiny, tmp_path, monkeypatch):
    pytest.importorskip("neptune")
    monkeypatch.setenv("NEPTUNE_MODE", "offline")
    monkeypatch.setenv("NEPTUNE_PROJECT", "ws/tw-proj")
    monkeypatch.chdir(tmp_path)
    trainer, losses = train(tiny, tmp_path, "neptune")
    (log,) = (tmp_path / ".neptune").rglob("data-1.log")
    ops = [json.loads(line)["obj"] for line in log.read_text().splitlines()]
    values = {"/".join(op["path"]): op.get("value") for op in ops if op["type"].startswith("Assign")}
    assert values["sys/name"] == RUN_NAME
    assert values["finetuning/trainer_parameters/learning_rate"] == LR
    assert values["finetuning/model_parameters/hidden_size"] == 2
    series = {v["step"]: v["value"] for op in ops if op["path"] == ["finetuning", "train", "loss"]
              for v in op["values"]}
    assert_losses(series, losses)


# ------------------------------------------------------------------------------------------------ Trackio
@pytest.mark.slow
def test_trackio_local(tmp_path):
    pytest.importorskip("trackio")
    read_back = """
        from trackio.sqlite_storage import SQLiteStorage
        result = {"runs": SQLiteStorage.get_runs("tw-proj"), "config": SQLiteStorage.get_run_config("tw-proj", "tw-run"),
                  "logs": SQLiteStorage.get_logs("tw-proj", "tw-run")}
    """
    out = train_in_child(tmp_path, "trackio", read_back, {"TRACKIO_DIR": str(tmp_path / "trackio"),
                                                         "TRACKIO_PROJECT": "tw-proj", "HF_HUB_OFFLINE": "1"})
    result = out["result"]
    assert result["runs"] == [RUN_NAME]
    assert result["config"]["learning_rate"] == LR and result["config"]["hidden_size"] == 2
    assert_losses({log["train/global_step"]: log["train/loss"] for log in result["logs"] if "train/loss" in log},
                  out["losses"])


# ------------------------------------------------------------------------------------------------ SwanLab
@pytest.mark.slow
def test_swanlab_offline(tmp_path):
    pytest.importorskip("swanlab")
    read_back = """
        import swanlab, yaml
        from swanlab.proto.swanlab.record.v1.record_pb2 import Record
        from swanlab.sdk.internal.core_python.store import DataStoreReader
        swanlab.finish()  # the callback leaves the run open after train(), as upstream
        (run_dir,) = [p for p in Path("swanlog").iterdir() if p.name.startswith("run-")]
        config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
        reader, start, loss = DataStoreReader(), None, {}
        reader.open(next(run_dir.glob("*.swanlab")))
        for data in reader:
            record = Record()
            record.ParseFromString(data)
            if record.HasField("start"):
                start = {"project": record.start.project, "name": record.start.name}
            elif record.HasField("scalar") and record.scalar.key == "train/loss":
                loss[record.scalar.step] = record.scalar.value.number
        result = {"config": {k: (v.get("value") if isinstance(v, dict) else v) for k, v in config.items()},
                  "start": start, "loss": loss}
    """
    out = train_in_child(tmp_path, "swanlab", read_back, {"SWANLAB_MODE": "offline", "SWANLAB_PROJECT": "tw-proj",
                                                         "SWANLAB_LOG_DIR": str(tmp_path / "swanlog")})
    result = out["result"]
    assert result["start"] == {"project": "tw-proj", "name": RUN_NAME}
    assert result["config"]["learning_rate"] == LR and result["config"]["hidden_size"] == 2
    assert_losses({int(k): v for k, v in result["loss"].items()}, out["losses"])


# ------------------------------------------------------------------------------------------------ lazy set-up
def test_lazy_tracker_sets_up_once_on_first_use_and_logs_on_the_main_process_only():
    """The contract the run-based trackers share (``callbacks/integrations/_lazy.py``)."""
    from types import SimpleNamespace

    from trainwell.callbacks.integrations._lazy import LazyTrackerCallback

    class Recorder(LazyTrackerCallback):
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def setup(self, args, state, model, **kwargs):
            self._initialized = True
            self.calls.append(("setup", model))

        def _logging(self, state):
            return state.is_world_process_zero

        def _log(self, args, state, logs):
            self.calls.append(("log", logs))

        def _log_predict(self, state, metrics):
            self.calls.append(("predict", metrics))

    main, replica = SimpleNamespace(is_world_process_zero=True), SimpleNamespace(is_world_process_zero=False)
    first = Recorder()  # an evaluate() before any training: the first log starts the run
    first.on_log(None, main, None, model="m", logs={"eval_loss": 1.0})
    first.on_log(None, main, None, model="m", logs={})  # nothing to write
    first.on_train_begin(None, main, None, model="m")
    assert first.calls == [("setup", "m"), ("log", {"eval_loss": 1.0})]
    second = Recorder()  # predict() first: set up with the model of the event's keyword arguments
    second.on_predict(None, main, None, metrics={"test_loss": 2.0}, model="p")
    assert second.calls == [("setup", "p"), ("predict", {"test_loss": 2.0})]
    other = Recorder()  # a replica sets up (upstream's setup decides what a replica does) and writes nothing
    other.on_log(None, replica, None, logs={"loss": 1.0})
    other.on_predict(None, replica, None, metrics={"test_loss": 2.0})
    assert other.calls == [("setup", None)]


def test_dvclive_and_clearml_do_not_log_predictions_as_upstream():
    from trainwell.callbacks.base import TrainerCallback
    from trainwell.callbacks.integrations import ClearMLCallback, DVCLiveCallback

    for cls in (DVCLiveCallback, ClearMLCallback):
        assert cls.on_predict is TrainerCallback.on_predict, cls.__name__


def test_dvclive_predict_alone_starts_no_run(tiny, tmp_path, monkeypatch):
    pytest.importorskip("dvclive")
    monkeypatch.chdir(tmp_path)  # a Live would write ./dvclive
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="dvclive", use_cpu=True, disable_tqdm=True)
    Trainer(model=tiny.RegressionModel(), args=args).predict(tiny.regression_data(8))
    assert not (tmp_path / "dvclive").exists()
