"""TFTrainer.setup_wandb / setup_comet in offline mode (skipped when the packages are not installed)."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

from tf_digits import DigitsClassifier, as_dataset, digits  # noqa: E402

from trainwell.tf import TFTrainer, TFTrainingArguments  # noqa: E402

pytestmark = pytest.mark.slow  # TensorFlow's import and the trackers' own packages: over a second a test


def _train(tmp_path, report_to):
    (xt, yt), _ = digits()
    args = TFTrainingArguments(output_dir=str(tmp_path / "out"), max_steps=2, logging_steps=1, save_strategy="no",
                               report_to=report_to, run_name="tf-run")
    trainer = TFTrainer(DigitsClassifier(), args, as_dataset(xt, yt))
    trainer.train()
    return trainer


def test_wandb_offline_run_gets_the_config_and_the_logs(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "tf-project")
    monkeypatch.delenv("WANDB_DISABLED", raising=False)
    wandb.teardown()  # an earlier test in this process may have set wandb up with other settings: read the env anew
    trainer = _train(tmp_path, ["wandb"])
    try:
        run = wandb.run
        assert run is not None and run.project == "tf-project" and run.name == "tf-run"
        assert run.config["max_steps"] == 2 and run.config["poly_power"] == 1.0
        logged = [h["loss"] for h in trainer.log_history]
        assert len(logged) == 2 and any(run.summary["loss"] == pytest.approx(v) for v in logged)  # async summary
    finally:
        wandb.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))


def test_wandb_disabled_by_the_environment(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    trainer = _train(tmp_path, ["wandb"])
    assert trainer._wandb is None and not (tmp_path / "wandb").exists()


def test_comet_offline_experiment_is_written(tmp_path, monkeypatch):
    pytest.importorskip("comet_ml")
    monkeypatch.setenv("COMET_MODE", "OFFLINE")
    monkeypatch.setenv("COMET_OFFLINE_DIRECTORY", str(tmp_path / "comet"))
    monkeypatch.setenv("COMET_PROJECT_NAME", "tf-project")
    trainer = _train(tmp_path, ["comet_ml"])
    experiment = trainer._comet
    assert experiment is not None and experiment.project_name == "tf-project"
    experiment.end()
    assert list((tmp_path / "comet").glob("*.zip"))
