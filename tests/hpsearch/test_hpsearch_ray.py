"""Trainer.hyperparameter_search(backend="ray") on a real local Ray Tune (CPU), and the refused backends."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from helpers.ray_session import ray_session
from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.hpsearch import resolve_backend


class Line(nn.Module):
    """y = w x + b; returns (loss, prediction)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        out = self.linear(x).squeeze(-1)
        return (out,) if labels is None else (nn.functional.mse_loss(out, labels), out)


class Points(torch.utils.data.Dataset):
    """y = 3x - 1 on fixed points."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.rand(n, 1, generator=gen) * 2 - 1
        self.y = 3 * self.x.squeeze(-1) - 1

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def make_trainer(tmp_path: Path, **overrides: Any) -> Trainer:
    options = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, per_device_eval_batch_size=16,
                   num_train_epochs=4, eval_strategy="steps", eval_steps=4, save_steps=4, logging_steps=4,
                   report_to="none", use_cpu=True, seed=0, disable_tqdm=True)
    options.update(overrides)
    return Trainer(model_init=lambda: Line(), args=TrainingArguments(**options),
                   train_dataset=Points(32, 0), eval_dataset=Points(16, 1))


def test_sigopt_and_wandb_backends_are_refused_by_name() -> None:
    for name in ("sigopt", "wandb"):
        with pytest.raises(NotImplementedError, match=f"backend='{name}'.*backend='ray'"):
            resolve_backend(name)
    with pytest.raises(ValueError, match="'optuna' or 'ray'"):
        resolve_backend("hyperopt")


def test_default_hp_space_ray_is_upstreams() -> None:
    tune = pytest.importorskip("ray.tune")
    from trainwell.trainer_utils import default_hp_space_ray

    space = default_hp_space_ray(None)
    assert sorted(space) == ["learning_rate", "num_train_epochs", "per_device_train_batch_size", "seed"]
    assert isinstance(space["learning_rate"], tune.search.sample.Float)
    assert space["num_train_epochs"].categories == [1, 2, 3, 4, 5]
    assert space["per_device_train_batch_size"].categories == [4, 8, 16, 32, 64]


@pytest.fixture(autouse=True)
def _driver_signal_handlers_put_back() -> Iterator[None]:
    """Ray Tune's run installs its own SIGINT and SIGUSR1 handlers in the driver (this process): put back those found."""
    import signal

    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGUSR1)}
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


@pytest.fixture(scope="module")
def session() -> Iterator[Path]:
    """One Ray session for the module (started by the shared helper, robust to a loaded machine); yields its scratch
    folder. Not tmp_path: Ray's socket paths must stay short."""
    pytest.importorskip("ray.tune")
    with ray_session(num_cpus=2) as (ray, folder):
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this module
        yield folder


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_search_of_four_trials_finds_the_better_learning_rate(session: Path) -> None:
    from ray import tune

    tmp_path = session / "search"
    trainer = make_trainer(tmp_path)
    best = trainer.hyperparameter_search(
        hp_space=lambda _: {"learning_rate": tune.grid_search([1e-4, 0.2])}, n_trials=2, backend="ray",
        direction="minimize", storage_path=str(tmp_path / "ray"), name="toy")
    _check_search(best, tmp_path)


def _check_search(best: Any, tmp_path: Path) -> None:
    assert best.hyperparameters == {"learning_rate": 0.2}
    analysis = best.run_summary
    assert len(analysis.trials) == 4 and all(t.status == "TERMINATED" for t in analysis.trials)
    objectives = sorted(t.last_result["objective"] for t in analysis.trials)
    assert best.objective == pytest.approx(objectives[0]) and objectives[0] < 0.1 * objectives[-1]
    # each trial trained under output_dir/run-<trial id> and reported its checkpoints to Ray
    for trial in analysis.trials:
        run = tmp_path / "out" / f"run-{trial.trial_id}"
        assert (run / "checkpoint-16").is_dir()
        assert trial.checkpoint is not None
        with trial.checkpoint.as_directory() as folder:
            assert (Path(folder) / "checkpoint-16" / "trainer_state.json").is_file()


class FailOnce(TrainerCallback):
    """Records the step each training run starts at; raises once at step 10 (after the checkpoint of step 8)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.started = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = False

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.started:
            self.started = True
            with open(os.path.join(self.folder, "starts"), "a") as f:
                f.write(f"{state.global_step}\n")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        flag = os.path.join(self.folder, "failed")
        if state.global_step == 10 and not os.path.exists(flag):
            open(flag, "w").close()
            raise RuntimeError("injected failure at step 10")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_failed_ray_trial_resumes_from_its_last_reported_checkpoint(session: Path) -> None:
    tmp_path = session / "resume"
    tmp_path.mkdir()
    trainer = make_trainer(tmp_path)
    trainer.add_callback(FailOnce(str(tmp_path)))
    best = trainer.hyperparameter_search(hp_space=lambda _: {"learning_rate": 0.2}, n_trials=1, backend="ray",
                                         storage_path=str(tmp_path / "ray"), name="resume", max_failures=1)
    starts = (tmp_path / "starts").read_text().split()
    assert starts == ["0", "8"]  # the restarted trial went on from the checkpoint of step 8
    trial = best.run_summary.trials[0]
    assert trial.status == "TERMINATED" and trial.last_result["epoch"] == 4.0
    assert best.objective < 1.0
