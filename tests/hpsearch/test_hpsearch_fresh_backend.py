"""Each hyper-parameter trial trains on a backend of its own (its GradScaler, its engine, no
reference to the previous trial's model or optimizer), as upstream's ``_hp_search_setup`` creates a new Accelerator
per trial; after the search the Trainer's own backend is back."""

from __future__ import annotations

from typing import Any

import pytest

from trainwell import Trainer, TrainerCallback

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)


class BackendRecorder(TrainerCallback):
    def __init__(self) -> None:
        self.trainer: Trainer | None = None
        self.seen: list[tuple[Any, Any, float]] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        backend = self.trainer.backend
        self.seen.append((backend, backend.scaler, args.learning_rate))


@pytest.mark.slow  # over a second
def test_every_trial_gets_a_fresh_backend_and_scaler(tiny: Any, make_args: Any) -> None:
    recorder = BackendRecorder()
    trainer = Trainer(model_init=lambda: tiny.RegressionModel(), args=make_args(num_train_epochs=1, eval_strategy="no"),
                      train_dataset=tiny.regression_data(16), eval_dataset=tiny.regression_data(8, seed=1),
                      callbacks=[recorder])
    recorder.trainer = trainer
    original = trainer.backend
    trainer.hyperparameter_search(hp_space=lambda t: {"learning_rate": t.suggest_float("learning_rate", 1e-3, 1e-1)},
                                  n_trials=3, sampler=optuna.samplers.RandomSampler(seed=0))
    backends, scalers, rates = zip(*recorder.seen)
    assert len(backends) == 3 and len({id(b) for b in backends}) == 3 and original not in backends
    assert len({id(s) for s in scalers}) == 3 and original.scaler not in scalers
    assert len(set(rates)) == 3  # three trials with their own arguments
    assert trainer.backend is original  # restored with the arguments after the search
