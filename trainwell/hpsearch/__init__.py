"""Hyper-parameter search for the Trainer with Optuna (the engine behind ``Trainer.hyperparameter_search``).

Each trial copies the Trainer's arguments with the overrides ``hp_space(trial)`` returns, trains a fresh model from
``model_init`` under ``output_dir/run-<trial.number>``, evaluates, and hands ``compute_objective(metrics)`` to
Optuna. A callback added for the search fills ``state.is_hyper_param_search``/``trial_name``/``trial_params`` and,
at each evaluation during training, reports the intermediate objective to the trial and stops the trial when the
study's pruner says so. The Trainer's arguments, state and model are restored when the search ends.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Any, Callable, Literal, cast

from ..callbacks import TrainerCallback
from ..utils.outputs import BestRun
from .ray import run_hp_search_ray
from .trials import FIXED_AT_INIT, SearchScope, SearchTrainer, trial_arguments

logger = logging.getLogger("trainwell.hpsearch")


class HPSearchBackend(str, Enum):
    """The search engines upstream names; trainwell runs ``optuna``."""

    OPTUNA = "optuna"
    RAY = "ray"
    SIGOPT = "sigopt"
    WANDB = "wandb"


# Evaluation metrics that measure speed or memory, not quality: left out of the default objective.
_NON_OBJECTIVE_SUFFIXES = ("_runtime", "_per_second", "_compilation_time", "_delta", "_peaked_delta")


def default_hp_space_optuna(trial: Any) -> dict[str, Any]:
    """Upstream's default space: learning rate (log) 1e-6..1e-4, 1..5 epochs, seed 1..40, batch size 4..64."""
    return {
        "learning_rate": trial.suggest_float("learning_rate", 1e-6, 1e-4, log=True),
        "num_train_epochs": trial.suggest_int("num_train_epochs", 1, 5),
        "seed": trial.suggest_int("seed", 1, 40),
        "per_device_train_batch_size": trial.suggest_categorical("per_device_train_batch_size", [4, 8, 16, 32, 64]),
    }


def default_compute_objective(metrics: Mapping[str, float]) -> float:
    """The evaluation loss when it is the only quality metric, else the sum of the quality metrics.

    ``epoch`` and the speed metrics (``*_runtime``, ``*_per_second``, ``*_compilation_time``) are left out, as
    upstream; trainwell also leaves out the memory metrics (``*_delta``), which say nothing about the model.
    """
    quality = {key: value for key, value in metrics.items()
               if key not in ("eval_loss", "epoch") and not key.endswith(_NON_OBJECTIVE_SUFFIXES)}
    if not quality:
        if "eval_loss" not in metrics:
            raise ValueError(f"default_compute_objective: the evaluation metrics {sorted(metrics)} hold neither "
                             "eval_loss nor a quality metric; pass compute_objective= to hyperparameter_search")
        return metrics["eval_loss"]
    return sum(quality.values())


def resolve_backend(backend: str | HPSearchBackend | None) -> HPSearchBackend:
    """The backend to run: optuna (picked when ``backend`` is None) or ray; sigopt and wandb are refused."""
    if backend is None:
        if importlib.util.find_spec("optuna") is None:
            raise RuntimeError("hyperparameter_search needs optuna: pip install optuna (or trainwell[optuna])")
        return HPSearchBackend.OPTUNA
    name = str(getattr(backend, "value", backend)).lower()
    choices = [member.value for member in HPSearchBackend]
    if name not in choices:
        raise ValueError(f"hyperparameter_search: backend={backend!r} is not known; use backend='optuna' "
                         "or 'ray' (or leave it None)")
    if name == HPSearchBackend.RAY.value:
        if importlib.util.find_spec("ray") is None:
            raise ImportError("hyperparameter_search(backend='ray') needs Ray Tune: pip install 'ray[tune]' "
                              "(or trainwell[ray])")
        return HPSearchBackend.RAY
    if name != HPSearchBackend.OPTUNA.value:
        raise NotImplementedError(f"hyperparameter_search: backend={name!r} is not supported by trainwell ({name} "
                                  "runs its trials through its hosted service, which trainwell does not reach); "
                                  "use backend='optuna' or backend='ray'")
    if importlib.util.find_spec("optuna") is None:
        raise ImportError("hyperparameter_search(backend='optuna') needs optuna: pip install optuna "
                          "(or trainwell[optuna])")
    return HPSearchBackend.OPTUNA


Direction = Literal["minimize", "maximize"]


def _directions(direction: str | Sequence[str]) -> list[Direction]:
    """``direction`` as a list of "minimize"/"maximize" (one per objective)."""
    items = [direction] if isinstance(direction, (str, Enum)) else list(direction)
    names = [str(getattr(item, "name", item)).lower() for item in items]
    bad = [item for item, name in zip(items, names) if name not in ("minimize", "maximize")]
    if not names or bad:
        raise ValueError(f"hyperparameter_search: direction={direction!r} is not valid; use 'minimize', "
                         "'maximize' or a list of them (one per objective)")
    return [cast(Direction, name) for name in names]


class HPSearchCallback(TrainerCallback):
    """Marks the trial in ``state`` at train begin; at each evaluation reports the objective and prunes.

    It is inserted first among the Trainer's callbacks for the search, so the others see the trial fields.
    """

    def __init__(self, compute_objective: Callable[[dict[str, float]], Any], multi_objective: bool) -> None:
        self.compute_objective = compute_objective
        self.multi_objective = multi_objective
        self.trial: Any = None
        self.trial_name: str | None = None
        self.trial_params: dict[str, Any] | None = None
        self.reporting = False
        self.last: tuple[int, Any] | None = None  # (global step, objective) of the last evaluation in training

    def begin_trial(self, trial: Any, name: str, params: dict[str, Any]) -> None:
        """Follow ``trial`` from the next ``train()`` on."""
        self.trial, self.trial_name, self.trial_params = trial, name, params
        self.reporting, self.last = True, None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Fill the trial fields of the fresh state the training run just made."""
        state.is_hyper_param_search = True
        state.trial_name = self.trial_name
        state.trial_params = dict(self.trial_params or {})

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        """Report the objective at this step; raise ``optuna.TrialPruned`` when the pruner stops the trial."""
        if not self.reporting or self.trial is None or not metrics:
            return
        objective = self.compute_objective(dict(metrics))
        self.last = (state.global_step, objective)
        if self.multi_objective:
            return  # Optuna prunes single-objective studies only
        import optuna

        self.trial.report(float(objective), state.global_step)
        if self.trial.should_prune():
            logger.info("Trial %s pruned at step %d (objective %s)", self.trial_name, state.global_step, objective)
            raise optuna.TrialPruned(f"trial {self.trial_name} pruned at step {state.global_step}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Stop reporting: the final evaluation after training is the trial's result, not an intermediate value."""
        self.reporting = False


def _objective_value(objective: Any, n_objectives: int) -> float | list[float]:
    """Check what ``compute_objective`` returned against the number of directions."""
    if n_objectives == 1:
        if isinstance(objective, (list, tuple)):
            raise ValueError(f"compute_objective returned {len(objective)} values but direction names one "
                             "objective; pass direction as a list with one entry per value")
        return float(objective)
    if not isinstance(objective, (list, tuple)) or len(objective) != n_objectives:
        raise ValueError(f"compute_objective must return {n_objectives} values (one per direction), got "
                         f"{objective!r}")
    return [float(value) for value in objective]


def _run_trial(trainer: SearchTrainer, trial: Any, base_args: Any, search: dict[str, Any]) -> float | list[float]:
    """Train and evaluate one trial; returns its objective (raises ``optuna.TrialPruned`` when pruned)."""
    import optuna

    overrides = search["hp_space"](trial)
    if not isinstance(overrides, Mapping):
        raise TypeError(f"hp_space must return a dict of TrainingArguments overrides, got {type(overrides).__name__}")
    name = search["hp_name"](trial) if search["hp_name"] is not None else f"run-{trial.number}"
    root = overrides.get("output_dir", base_args.output_dir)
    # its own arguments, checkpoint folder and backend (a new GradScaler), as upstream's new Accelerator per trial
    trainer._adopt_arguments(trial_arguments(base_args, overrides, os.path.join(root, name)))
    callback: HPSearchCallback = search["callback"]
    callback.begin_trial(trial, name, dict(overrides))
    try:
        trainer.train(trial=trial)
    except optuna.TrialPruned:
        # train() never reached its end: close the integrations' runs and the memory measure, as upstream does
        trainer._memory_tracker.stop("train")
        trainer.control = trainer.callback_handler.on_train_end(trainer.args, trainer.state, trainer.control)
        raise
    last = callback.last
    if last is not None and last[0] == trainer.state.global_step and not trainer.args.load_best_model_at_end:
        objective = last[1]  # the final weights were just evaluated: no second pass
    else:
        objective = search["compute_objective"](trainer.evaluate())
    return _objective_value(objective, search["n_objectives"])


def _split_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keyword arguments for ``optuna.create_study`` and for ``Study.optimize``; an unknown one is an error."""
    import optuna

    study_keys = set(inspect.signature(optuna.create_study).parameters) - {"direction", "directions"}
    optimize_keys = set(inspect.signature(optuna.study.Study.optimize).parameters) - {"self", "func", "n_trials"}
    unknown = sorted(set(kwargs) - study_keys - optimize_keys)
    if unknown:
        raise TypeError(f"hyperparameter_search got unknown keyword arguments {unknown}; it accepts those of "
                        f"optuna.create_study {sorted(study_keys)} and Study.optimize {sorted(optimize_keys)}")
    if kwargs.get("n_jobs", 1) != 1:
        raise ValueError(f"hyperparameter_search: n_jobs={kwargs['n_jobs']} is not supported; trials share one "
                         "Trainer and run one after another (n_jobs=1)")
    study = {k: v for k, v in kwargs.items() if k in study_keys}
    optimize = {k: v for k, v in kwargs.items() if k in optimize_keys}
    return study, optimize


def _best_runs(study: Any, n_objectives: int) -> BestRun | list[BestRun]:
    """The best trial (single objective) or the Pareto front (several); the study rides along as run_summary."""
    import optuna

    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        raise RuntimeError(f"hyperparameter_search: none of the {len(study.trials)} trials completed (all pruned or "
                           "failed); run more trials, loosen the pruner, or check the trials' errors in the log")
    if n_objectives == 1:
        best = study.best_trial
        return BestRun(str(best.number), best.value, best.params, study)
    return [BestRun(str(t.number), list(t.values), t.params, study) for t in study.best_trials]


def run_hyperparameter_search(
    trainer: SearchTrainer,
    hp_space: Callable[[Any], dict[str, Any]] | None = None,
    compute_objective: Callable[[dict[str, float]], Any] | None = None,
    n_trials: int = 20,
    direction: str | Sequence[str] = "minimize",
    backend: str | HPSearchBackend | None = None,
    hp_name: Callable[[Any], str] | None = None,
    *,
    scope: SearchScope,
    **kwargs: Any,
) -> BestRun | list[BestRun]:
    """Run an Optuna study over ``trainer``; see :meth:`trainwell.Trainer.hyperparameter_search`. ``scope`` (the
    Trainer's) puts the Trainer's own arguments, model and state back after the trials."""
    if trainer.model_init is None:
        raise RuntimeError("hyperparameter_search needs a `model_init` function (each trial trains a new model): "
                           "pass Trainer(model_init=lambda: MyModel(), ...) instead of model=")
    chosen = resolve_backend(backend)
    if trainer.args.world_size > 1:
        raise NotImplementedError("hyperparameter_search runs in a single process in trainwell; launch it without "
                                  "torchrun/accelerate (world_size=1)")
    if chosen is HPSearchBackend.RAY:
        return run_hp_search_ray(trainer, hp_space, compute_objective or default_compute_objective, n_trials,
                                 _directions(direction)[0] if isinstance(direction, (str, Enum)) else direction,
                                 hp_name, search_scope=scope, **kwargs)
    directions = _directions(direction)
    study_kwargs, optimize_kwargs = _split_kwargs(kwargs)
    import optuna

    compute_objective = compute_objective or default_compute_objective
    callback = HPSearchCallback(compute_objective, multi_objective=len(directions) > 1)
    search = dict(hp_space=hp_space or default_hp_space_optuna, hp_name=hp_name, callback=callback,
                  compute_objective=compute_objective, n_objectives=len(directions))
    if len(directions) == 1:
        study = optuna.create_study(direction=directions[0], **study_kwargs)
    else:
        study = optuna.create_study(directions=directions, **study_kwargs)
    base_args = trainer.args
    with scope():  # the arguments, model, state... are the Trainer's own again afterwards
        trainer.callback_handler.callbacks = [callback, *trainer.callback_handler.callbacks]
        study.optimize(lambda trial: _run_trial(trainer, trial, base_args, search), n_trials=n_trials,
                       **optimize_kwargs)
    return _best_runs(study, len(directions))


__all__ = ["HPSearchBackend", "HPSearchCallback", "default_compute_objective", "default_hp_space_optuna",
           "resolve_backend", "run_hyperparameter_search", "trial_arguments"]
