"""Hyper-parameter search on Ray Tune (``Trainer.hyperparameter_search(backend="ray")``), as upstream.

``hp_space(None)`` returns a Ray Tune search space (a dict of ``tune.loguniform(...)``, ``tune.choice(...)``...);
``ray.tune.run`` samples ``n_trials`` configurations and runs each in a Ray worker process: the Trainer (its model
left out: ``model_init`` makes a fresh one) is shipped to the worker with ``tune.with_parameters``, trains under
``output_dir/run-<trial id>`` with ``train(trial=config)``, and reports ``compute_objective(metrics)`` as the
``objective`` of each evaluation. An evaluation followed by a checkpoint reports the checkpoint too (a copy of the
``checkpoint-N`` folder), so Ray's schedulers can stop, pause and resume trials, and a trial Ray restarts resumes from
its last reported checkpoint. The best trial is picked with ``scope=$RAY_SCOPE`` (default ``"last"``).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from ..callbacks import TrainerCallback
from ..utils.outputs import BestRun
from .trials import SearchScope, SearchTrainer, trial_arguments

logger = logging.getLogger("trainwell.hpsearch")

# Ray schedulers that decide from the intermediate results: useless (upstream: an error) without evaluations.
_SCHEDULERS_NEEDING_EVALUATION = ("ASHAScheduler", "AsyncHyperBandScheduler", "MedianStoppingRule",
                                  "HyperBandForBOHB", "HyperBandScheduler", "PopulationBasedTraining")


def default_hp_space_ray(trial: Any) -> dict[str, Any]:
    """Upstream's default Ray space: learning rate (log) 1e-6..1e-4, 1..5 epochs, seed 1..40, batch size 4..64."""
    try:
        from ray import tune
    except ImportError as err:
        raise ImportError("default_hp_space_ray needs Ray Tune: pip install 'ray[tune]' (or trainwell[ray])") from err
    return {
        "learning_rate": tune.loguniform(1e-6, 1e-4),
        "num_train_epochs": tune.choice(list(range(1, 6))),
        "seed": tune.uniform(1, 40),
        "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
    }


class RayReportCallback(TrainerCallback):
    """Reports each evaluation during training to Ray Tune, with the checkpoint saved at the same step."""

    def __init__(self, compute_objective: Callable[[dict[str, float]], Any]) -> None:
        self.compute_objective = compute_objective
        self.reporting = False
        self.pending: dict[str, Any] | None = None  # the last evaluation's result, not yet reported
        self.last_step: int | None = None  # global step of the last evaluation during training

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.reporting, self.pending, self.last_step = True, None, None

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        """Keep the result: the checkpoint of this step (if any) is written after the evaluation."""
        if not self.reporting or not metrics:
            return
        self._flush()
        self.pending = {**metrics, "objective": float(self.compute_objective(dict(metrics)))}
        self.last_step = state.global_step

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Report the evaluation of this step with a copy of the checkpoint just written."""
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not self.reporting or self.pending is None or self.last_step != state.global_step or not folder.is_dir():
            return
        from ray import tune

        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(folder, Path(tmp) / folder.name)
            tune.report(self.pending, checkpoint=tune.Checkpoint.from_directory(tmp))
        self.pending = None

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._flush()
        self.reporting = False

    def _flush(self) -> None:
        if self.pending is not None:
            from ray import tune

            tune.report(self.pending)
            self.pending = None


def _trainable(config: dict[str, Any], local_trainer: SearchTrainer | None = None, base_args: Any = None,
               hp_name: Callable[[Any], str] | None = None) -> None:
    """One Ray trial, in a Ray worker: train (resuming from Ray's checkpoint when it restarts the trial), evaluate."""
    from ray import tune

    trainer = local_trainer
    if trainer is None:
        raise ValueError("_trainable runs a Ray trial of a Trainer: pass it as local_trainer (tune.with_parameters)")
    name = hp_name(config) if hp_name is not None else f"run-{tune.get_context().get_trial_id()}"
    params = {key: value for key, value in config.items() if key != "wandb"}  # (train(trial=config) sets them again)
    # its own arguments, checkpoint folder and backend (a new GradScaler), as upstream's new Accelerator per trial
    trainer._adopt_arguments(trial_arguments(base_args, params, os.path.join(base_args.output_dir, name)))
    callback = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, RayReportCallback))
    resume_from = None
    checkpoint = tune.get_checkpoint()
    with tempfile.TemporaryDirectory() as tmp:
        if checkpoint is not None:
            restored = Path(checkpoint.to_directory(tmp))
            resume_from = str(next(restored.glob("checkpoint-*")))
        trainer.train(resume_from_checkpoint=resume_from, trial=config)
    if callback.last_step == trainer.state.global_step and not trainer.args.load_best_model_at_end:
        return  # the final weights were evaluated and reported during training
    metrics = trainer.evaluate()
    tune.report({**metrics, "objective": float(callback.compute_objective(dict(metrics))), "done": True})


def run_hp_search_ray(trainer: SearchTrainer, hp_space: Callable[[Any], dict[str, Any]] | None, compute_objective: Callable,
                      n_trials: int, direction: str | Sequence[str], hp_name: Callable[[Any], str] | None,
                      *, search_scope: SearchScope, **kwargs: Any) -> BestRun:
    """Run the trials with ``ray.tune.run`` (``kwargs`` go to it: ``resources_per_trial``, ``scheduler``,
    ``search_alg``, ``storage_path``, ``name``, ``resume``...); returns the best trial as a ``BestRun``.
    ``search_scope`` is the Trainer's (see ``run_hyperparameter_search``)."""
    try:
        from ray import tune
    except ImportError as err:
        raise ImportError("hyperparameter_search(backend='ray') needs Ray Tune: pip install 'ray[tune]' "
                          "(or trainwell[ray])") from err
    if not isinstance(direction, str) or direction not in ("minimize", "maximize"):
        raise ValueError(f"hyperparameter_search(backend='ray'): direction={direction!r} must be 'minimize' or "
                         "'maximize' (Ray Tune searches one objective)")
    scheduler = kwargs.get("scheduler")
    if scheduler is not None and type(scheduler).__name__ in _SCHEDULERS_NEEDING_EVALUATION \
            and trainer.args.eval_strategy == "no":
        raise RuntimeError(f"{type(scheduler).__name__} decides from the evaluations during training, but "
                           "eval_strategy='no': set eval_strategy='steps' or 'epoch' in the TrainingArguments, or "
                           "drop the scheduler")
    kwargs.setdefault("resources_per_trial", {"cpu": 1, **({"gpu": 1} if trainer.args.n_gpu > 0 else {})})
    kwargs.setdefault("verbose", 0)
    space = (hp_space or default_hp_space_ray)(None)
    base_args = trainer.args
    base_args = _absolute_output_dir(base_args)  # Ray runs each trial in its own working directory
    callback = RayReportCallback(compute_objective)
    # model_init makes each trial's model: the Trainer the workers receive has none (then put back, with its callbacks)
    with search_scope(without_model=True):
        trainer.callback_handler.callbacks = [callback, *trainer.callback_handler.callbacks]
        trainable = tune.with_parameters(_trainable, local_trainer=trainer, base_args=base_args, hp_name=hp_name)
    analysis = tune.run(trainable, config=space, num_samples=n_trials, **kwargs)
    scope = os.getenv("RAY_SCOPE") or trainer.args.ray_scope or "last"  # upstream: args.ray_scope
    best = analysis.get_best_trial(metric="objective", mode=direction[:3], scope=scope)
    if best is None:
        raise RuntimeError(f"hyperparameter_search(backend='ray'): no trial reported an objective (scope "
                           f"{scope!r}); see the trials' errors in the log")
    return BestRun(best.trial_id, best.last_result["objective"], best.config, analysis)


def _absolute_output_dir(args: Any) -> Any:
    return dataclasses.replace(args, output_dir=os.path.abspath(args.output_dir))


__all__ = ["RayReportCallback", "default_hp_space_ray", "run_hp_search_ray"]
