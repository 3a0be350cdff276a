"""Trainer.hyperparameter_search with Optuna: trials, overrides, objectives, pruning, errors, restoration."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from trainwell import Trainer, TrainerCallback
from trainwell.hpsearch import default_compute_objective, trial_arguments
from trainwell.trainer_utils import BestRun

pytestmark = pytest.mark.slow  # several trainings per search: over a second a test

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


class Recorder(TrainerCallback):
    """Records, per training run, the arguments and trial fields it starts with, its evaluations and its end."""

    def __init__(self) -> None:
        self.runs: list[dict[str, Any]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.runs.append(dict(lr=args.learning_rate, epochs=args.num_train_epochs, seed=args.seed,
                              batch=args.per_device_train_batch_size, output_dir=args.output_dir,
                              max_steps=state.max_steps, search=state.is_hyper_param_search,
                              name=state.trial_name, params=state.trial_params, evals=[], ended=False))

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        if self.runs:
            self.runs[-1]["evals"].append((state.global_step, dict(metrics)))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.runs[-1]["ended"] = True


def mae_metrics(prediction: Any) -> dict[str, float]:
    """Mean absolute error of the regression (a second quality metric)."""
    return {"mae": float(abs(prediction.predictions - prediction.label_ids).mean())}


@pytest.fixture
def build(tiny: Any, make_args: Any) -> Any:
    """``build(**args)`` -> a Trainer on the tiny regression with a model_init, a Recorder and an eval set."""

    def make(*, model_init: Any = None, callbacks: list[Any] | None = None, compute_metrics: Any = None,
             **overrides: Any) -> Trainer:
        options = dict(num_train_epochs=1, eval_strategy="no")
        options.update(overrides)
        return Trainer(model_init=model_init or (lambda: tiny.RegressionModel()), args=make_args(**options),
                       train_dataset=tiny.regression_data(32), eval_dataset=tiny.regression_data(16, seed=1),
                       callbacks=callbacks, compute_metrics=compute_metrics)

    return make


def lr_space(trial: Any) -> dict[str, Any]:
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 0.3, log=True)}


def test_deterministic_search_finds_the_best_trial(build: Any) -> None:
    def search() -> tuple[BestRun, list[float]]:
        trainer = build()
        best = trainer.hyperparameter_search(hp_space=lr_space, n_trials=4, direction="minimize",
                                             sampler=optuna.samplers.TPESampler(seed=0))
        return best, [t.value for t in best.run_summary.trials]

    best, values = search()
    assert isinstance(best, BestRun) and len(values) == 4
    assert best.objective == min(values)
    assert best.run_id == str(values.index(min(values)))
    assert set(best.hyperparameters) == {"learning_rate"}
    again, values_again = search()
    assert values_again == values and again.hyperparameters == best.hyperparameters
    # the objective is the eval loss of a model trained with the best learning rate
    trainer = build(learning_rate=best.hyperparameters["learning_rate"])
    trainer.train()
    assert trainer.evaluate()["eval_loss"] == pytest.approx(best.objective, rel=1e-6)


def test_hp_space_overrides_are_applied_and_args_restored(build: Any, tiny: Any, tmp_path: Any) -> None:
    recorder, seen_trials = Recorder(), []

    def model_init(trial: Any) -> torch.nn.Module:
        seen_trials.append(None if trial is None else trial.number)
        return tiny.RegressionModel()

    def space(trial: Any) -> dict[str, Any]:
        return {"learning_rate": trial.suggest_float("learning_rate", 0.01, 0.1),
                "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 2),
                "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [8, 16]),
                "seed": trial.suggest_int("seed", 1, 40), "weight_decay": 0.25}

    trainer = build(model_init=model_init, callbacks=[recorder], save_strategy="epoch")
    original_args, original_state = trainer.args, trainer.state
    best = trainer.hyperparameter_search(hp_space=space, n_trials=3, sampler=optuna.samplers.RandomSampler(seed=3))
    trials = best.run_summary.trials
    assert seen_trials == [None, 0, 1, 2]  # the constructor's call, then one model per trial
    assert len(recorder.runs) == 3
    for trial, run in zip(trials, recorder.runs):
        params = trial.params
        assert run["lr"] == params["learning_rate"] and run["seed"] == params["seed"]
        assert run["epochs"] == params["num_train_epochs"] and isinstance(run["epochs"], float)
        assert run["batch"] == params["per_device_train_batch_size"]
        assert run["max_steps"] == params["num_train_epochs"] * math.ceil(32 / params["per_device_train_batch_size"])
        assert run["output_dir"] == str(tmp_path / "out" / f"run-{trial.number}")
        assert (tmp_path / "out" / f"run-{trial.number}" / f"checkpoint-{run['max_steps']}").is_dir()
        assert run["search"] is True and run["name"] == f"run-{trial.number}"
        assert run["params"] == {**params, "weight_decay": 0.25}
    assert trainer.args is original_args and trainer.args.learning_rate == 0.05
    assert trainer.state is original_state and not trainer.state.is_hyper_param_search
    assert [type(cb).__name__ for cb in trainer.callback_handler.callbacks].count("HPSearchCallback") == 0
    assert not list((tmp_path / "out").glob("checkpoint-*"))  # nothing written outside the trial folders


def test_multi_objective_returns_the_pareto_front(build: Any) -> None:
    trainer = build(compute_metrics=mae_metrics, eval_strategy="steps", eval_steps=2)
    front = trainer.hyperparameter_search(
        hp_space=lr_space, n_trials=4, direction=["minimize", "maximize"],
        compute_objective=lambda m: [m["eval_loss"], m["eval_mae"]], sampler=optuna.samplers.RandomSampler(seed=0))
    assert isinstance(front, list) and front and all(isinstance(run, BestRun) for run in front)
    points = {t.number: t.values for t in front[0].run_summary.trials}

    def dominated(p: list[float]) -> bool:  # loss down and mae up pull apart: several trials are on the front
        return any(q[0] <= p[0] and q[1] >= p[1] and q != p for q in points.values())

    expected = sorted(n for n, p in points.items() if not dominated(p))
    assert len(expected) >= 2 and sorted(int(run.run_id) for run in front) == expected
    for run in front:
        assert run.objective == points[int(run.run_id)] and len(run.objective) == 2


def test_median_pruner_prunes_a_bad_trial(build: Any) -> None:
    recorder = Recorder()
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage, study_name="prune")
    for lr in (0.1, 0.1, 0.1, 1e-7):  # three good trials, then a learning rate that cannot learn
        study.enqueue_trial({"learning_rate": lr})
    trainer = build(callbacks=[recorder], eval_strategy="steps", eval_steps=1, num_train_epochs=2)
    best = trainer.hyperparameter_search(
        hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-8, 1.0, log=True)}, n_trials=4,
        storage=storage, study_name="prune", load_if_exists=True,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0))
    states = [t.state for t in study.trials]
    assert states[:3] == [optuna.trial.TrialState.COMPLETE] * 3
    assert states[3] == optuna.trial.TrialState.PRUNED
    bad = recorder.runs[3]
    assert len(bad["evals"]) < bad["max_steps"] == 8  # stopped early
    assert bad["ended"]  # on_train_end still reached the callbacks
    assert study.trials[3].intermediate_values  # the objective was reported before pruning
    assert best.run_id in {"0", "1", "2"} and best.hyperparameters == {"learning_rate": 0.1}
    assert trainer.state.global_step == 0  # restored


def test_search_needs_model_init(tiny: Any, make_args: Any) -> None:
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(), train_dataset=tiny.regression_data(8))
    with pytest.raises(RuntimeError, match="model_init"):
        trainer.hyperparameter_search(hp_space=lr_space, n_trials=1)


def test_unknown_or_fixed_keys_are_refused(build: Any) -> None:
    trainer = build()
    original = trainer.args
    with pytest.raises(AttributeError, match="'learning_rat'.*did you mean 'learning_rate'"):
        trainer.hyperparameter_search(hp_space=lambda t: {"learning_rat": 0.1}, n_trials=1)
    assert trainer.args is original
    with pytest.raises(ValueError, match="'fp16'.*cannot change per trial"):
        trainer.hyperparameter_search(hp_space=lambda t: {"fp16": True}, n_trials=1)
    with pytest.raises(ValueError, match="max_steps=2.5 must be a whole number"):
        trial_arguments(original, {"max_steps": 2.5}, "x")


def test_bad_backend_direction_and_kwargs(build: Any) -> None:
    trainer = build()
    with pytest.raises(NotImplementedError, match="backend='sigopt'.*'optuna'"):
        trainer.hyperparameter_search(backend="sigopt")
    with pytest.raises(ValueError, match="backend='nope'"):
        trainer.hyperparameter_search(backend="nope")
    with pytest.raises(ValueError, match="direction='up'"):
        trainer.hyperparameter_search(direction="up")
    with pytest.raises(ValueError, match="n_jobs=2"):
        trainer.hyperparameter_search(n_jobs=2)
    with pytest.raises(TypeError, match="'samplr'"):
        trainer.hyperparameter_search(samplr=None)


def test_custom_compute_objective_and_maximize(build: Any) -> None:
    recorder = Recorder()
    trainer = build(compute_metrics=mae_metrics, callbacks=[recorder], eval_strategy="epoch")
    best = trainer.hyperparameter_search(hp_space=lr_space, n_trials=3, direction="maximize",
                                         compute_objective=lambda m: m["eval_mae"],
                                         sampler=optuna.samplers.RandomSampler(seed=1))
    trials = best.run_summary.trials
    final_mae = [run["evals"][-1][1]["eval_mae"] for run in recorder.runs]
    assert [t.value for t in trials] == pytest.approx(final_mae)
    assert best.objective == max(final_mae) and best.run_id == str(final_mae.index(max(final_mae)))
    assert all(len(run["evals"]) == 1 for run in recorder.runs)  # the epoch-end evaluation is reused, not repeated


def test_default_compute_objective() -> None:
    speed = {"eval_runtime": 1.5, "eval_samples_per_second": 9.0, "eval_steps_per_second": 2.0, "epoch": 3.0}
    assert default_compute_objective({"eval_loss": 0.25, **speed}) == 0.25
    assert default_compute_objective({"eval_loss": 0.25, "eval_acc": 0.5, "eval_f1": 0.25, **speed}) == 0.75
    assert default_compute_objective({"eval_loss": 0.25, "eval_mem_cpu_alloc_delta": 4096}) == 0.25
    with pytest.raises(ValueError, match="compute_objective="):
        default_compute_objective(speed)
