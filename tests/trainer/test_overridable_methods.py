"""Every upstream overridable method a subclass overrides is reached where upstream calls it, and its result is used.

Each test overrides one method of :class:`trainwell.Trainer` with upstream's signature and asserts a value that only
the override can have produced (a loss, a learning rate, a file, a weight, a batch order), never only "it ran".
docs/overridable_methods.md lists these tests next to the methods.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, SequentialSampler

from helpers import RegressionModel, regression_data
from trainwell import Trainer, TrainerCallback

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _trainer(cls: type[Trainer], make_args: Any, *, data: Any = None, eval_data: Any = None,
             **args: Any) -> Trainer:
    torch.manual_seed(0)
    return cls(model=RegressionModel(), args=make_args(**args), train_dataset=data or regression_data(32),
               eval_dataset=eval_data)


class StopAt(TrainerCallback):
    """Stops training after ``step``: an interruption with the full run's schedule."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


# --------------------------------------------------------------------------------------------- saving, loading
class CustomLayout(Trainer):
    """A checkpoint layout of its own (as sentence-transformers'): weights in ``custom.pt`` plus ``layout.json``,
    no ``model.safetensors``; the optimizer in ``my_optim.pt``. Loads read the same files."""

    calls: list[tuple[str, Any]]

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        self.calls.append(("_save", output_dir))
        torch.save(self.model.state_dict(), Path(output_dir) / "custom.pt")
        Path(output_dir, "layout.json").write_text(json.dumps({"layout": "custom"}))

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        self.calls.append(("_save_optimizer_and_scheduler", output_dir))
        torch.save({"optimizer": self.optimizer.state_dict(), "scheduler": self.lr_scheduler.state_dict()},
                   Path(output_dir) / "my_optim.pt")

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: torch.nn.Module | None = None) -> None:
        self.calls.append(("_load_from_checkpoint", resume_from_checkpoint))
        self.model.load_state_dict(torch.load(Path(resume_from_checkpoint) / "custom.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        self.calls.append(("_load_optimizer_and_scheduler", checkpoint))
        saved = torch.load(Path(checkpoint) / "my_optim.pt", weights_only=False)
        self.optimizer.load_state_dict(saved["optimizer"])
        self.lr_scheduler.load_state_dict(saved["scheduler"])

    def _load_rng_state(self, checkpoint: str | None) -> None:
        self.calls.append(("_load_rng_state", checkpoint))
        super()._load_rng_state(checkpoint)


def _custom(make_args: Any, stop_at: int | None = None, **args: Any) -> CustomLayout:
    trainer = _trainer(CustomLayout, make_args, save_strategy="steps", save_steps=2, num_train_epochs=2,
                       logging_steps=1, **args)
    trainer.calls = []
    if stop_at is not None:
        trainer.add_callback(StopAt(stop_at))
    return trainer


def test_save_writes_the_checkpoint_and_it_is_committed_with_its_own_layout(make_args: Any) -> None:
    from trainwell.checkpoint.layout import COMPLETE_MARKER, list_complete_checkpoints

    trainer = _custom(make_args)
    trainer.train()
    folder = Path(trainer.args.output_dir) / "checkpoint-2"
    names = {p.name for p in folder.iterdir()}
    assert {"custom.pt", "layout.json", "my_optim.pt", "data_state.json", COMPLETE_MARKER} <= names
    assert "model.safetensors" not in names and "optimizer.pt" not in names
    assert ("_save", str(folder.parent / f".tmp-checkpoint-2-{__import__('os').getpid()}")) in trainer.calls
    marker = (folder / COMPLETE_MARKER).read_text()
    assert "custom.pt" in marker and "my_optim.pt" in marker  # checksummed like trainwell's own files
    assert folder in list_complete_checkpoints(trainer.args.output_dir)
    trainer.save_model(str(Path(trainer.args.output_dir) / "final"))
    assert trainer.calls[-1] == ("_save", str(Path(trainer.args.output_dir) / "final"))
    saved = torch.load(Path(trainer.args.output_dir) / "final" / "custom.pt")
    assert torch.equal(saved["linear.weight"], trainer.model.linear.weight)


def test_resume_loads_through_the_overrides_and_is_exact(make_args: Any) -> None:
    full = _custom(make_args)
    full.train()
    out = Path(full.args.output_dir)
    for child in out.iterdir():  # a fresh output_dir for the interrupted run
        __import__("shutil").rmtree(child) if child.is_dir() else child.unlink()
    _custom(make_args, stop_at=4).train()
    resumed = _custom(make_args)
    resumed.train(resume_from_checkpoint=True)
    folder = str(out / "checkpoint-4")
    assert [c for c in resumed.calls if c[0].startswith("_load")] == [
        ("_load_from_checkpoint", folder), ("_load_optimizer_and_scheduler", folder), ("_load_rng_state", folder)]
    assert torch.equal(resumed.model.linear.weight, full.model.linear.weight)
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h and h["step"] > 4] for t in (full, resumed)]
    assert losses[0] == losses[1] and losses[0]


def test_load_best_model_is_called_at_the_end(make_args: Any) -> None:
    class Best(Trainer):
        def _load_best_model(self) -> None:
            with torch.no_grad():
                self.model.linear.weight.fill_(42.0)

    trainer = _trainer(Best, make_args, eval_data=regression_data(8, 1), eval_strategy="steps", eval_steps=2,
                       save_strategy="steps", save_steps=2, load_best_model_at_end=True, max_steps=4)
    trainer.train()
    assert torch.all(trainer.model.linear.weight == 42.0)


def test_save_checkpoint_override_without_tr_loss_writes_the_data_state(make_args: Any) -> None:
    class TrlLike(Trainer):
        def _save_checkpoint(self, model: torch.nn.Module, trial: Any) -> None:  # TRL's signature
            super()._save_checkpoint(model, trial)

    trainer = _trainer(TrlLike, make_args, save_strategy="steps", save_steps=2, max_steps=2, logging_steps=1)
    trainer.train()
    data_state = json.loads((Path(trainer.args.output_dir) / "checkpoint-2" / "data_state.json").read_text())
    assert data_state["global_step"] == 2 and data_state["last_logged_step"] == 2


# ---------------------------------------------------------------------------------------------- the step
def test_compute_loss_override_is_the_loss_trained_and_logged(make_args: Any) -> None:
    class Const(Trainer):
        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            loss = model(**inputs)["loss"] * 0 + 5.0
            return (loss, None) if return_outputs else loss

    trainer = _trainer(Const, make_args, max_steps=2, logging_steps=1)
    trainer.train()
    assert [h["loss"] for h in trainer.state.log_history if "loss" in h] == [5.0, 5.0]


def test_training_step_override_is_reached_with_num_items_and_its_loss_logged(make_args: Any) -> None:
    seen: list[Any] = []

    class Step(Trainer):
        def training_step(self, model: Any, inputs: dict, num_items_in_batch: Any = None) -> torch.Tensor:
            seen.append(num_items_in_batch)
            super().training_step(model, inputs, num_items_in_batch)
            return torch.tensor(7.0)

    trainer = _trainer(Step, make_args, max_steps=2, logging_steps=1)
    trainer.train()
    assert [h["loss"] for h in trainer.state.log_history if "loss" in h] == [7.0, 7.0] and len(seen) == 2


def test_training_step_puts_the_model_back_in_train_mode(make_args: Any) -> None:
    modes: list[bool] = []

    class EvalAfterStep(TrainerCallback):  # what sentence-transformers' encode() during a save leaves
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            model.eval()

    class Record(Trainer):
        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            modes.append(model.training)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    trainer = _trainer(Record, make_args, max_steps=3)
    trainer.add_callback(EvalAfterStep())
    trainer.train()
    assert modes == [True, True, True]


def test_prepare_inputs_override_feeds_the_model(make_args: Any) -> None:
    class ZeroLabels(Trainer):
        def _prepare_inputs(self, inputs: dict) -> dict:
            inputs = super()._prepare_inputs(inputs)
            return {**inputs, "x": torch.zeros_like(inputs["x"]), "labels": torch.full_like(inputs["labels"], 3.0)}

    trainer = _trainer(ZeroLabels, make_args, max_steps=1, logging_steps=1, learning_rate=0.0)
    bias = trainer.model.linear.bias.item()
    trainer.train()
    assert trainer.state.log_history[0]["loss"] == pytest.approx((bias - 3.0) ** 2, rel=1e-5)


def test_prediction_step_override_gives_the_predictions(make_args: Any) -> None:
    class Fixed(Trainer):
        def prediction_step(self, model: Any, inputs: dict, prediction_loss_only: bool,
                            ignore_keys: Any = None) -> tuple[Any, Any, Any]:
            n = inputs["x"].shape[0]
            return torch.tensor(1.5), torch.arange(n, dtype=torch.float32), inputs["labels"]

    trainer = _trainer(Fixed, make_args)
    out = trainer.predict(regression_data(4, 1))
    assert out.predictions.tolist() == [0.0, 1.0, 2.0, 3.0] and out.metrics["test_loss"] == pytest.approx(1.5)


# ------------------------------------------------------------------------------------- optimizer, schedule, log
def test_create_optimizer_override_is_the_optimizer(make_args: Any) -> None:
    class Sgd(Trainer):
        def create_optimizer(self, model: Any = None) -> torch.optim.Optimizer:
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.5)
            return self.optimizer

    trainer = _trainer(Sgd, make_args, max_steps=1)
    trainer.train()
    assert type(trainer.optimizer) is torch.optim.SGD and trainer.optimizer.param_groups[0]["initial_lr"] == 0.5


def test_create_scheduler_override_sets_the_logged_rate(make_args: Any) -> None:
    class Half(Trainer):
        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            self.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer or self.optimizer, lambda step: 0.5)
            return self.lr_scheduler

    trainer = _trainer(Half, make_args, max_steps=2, logging_steps=1, learning_rate=0.1)
    trainer.train()
    assert [h["learning_rate"] for h in trainer.state.log_history if "loss" in h] == [0.05, 0.05]


def test_log_override_gets_start_time_and_its_logs_are_kept(make_args: Any) -> None:
    starts: list[Any] = []

    class Tagged(Trainer):
        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            starts.append(start_time)
            super().log({**logs, "tag": 1.0}, start_time)

    trainer = _trainer(Tagged, make_args, max_steps=2, logging_steps=1)
    trainer.train()
    assert all(h.get("tag") == 1.0 for h in trainer.state.log_history) and len(trainer.state.log_history) == 3
    assert any(isinstance(s, float) for s in starts)


# --------------------------------------------------------------------------------------------------- data
def test_get_train_dataloader_override_is_trained_on(make_args: Any) -> None:
    class Three(Trainer):
        def get_train_dataloader(self) -> DataLoader:
            return DataLoader(regression_data(12), batch_size=4, collate_fn=self.data_collator)

    trainer = _trainer(Three, make_args, num_train_epochs=1)
    trainer.train()
    assert trainer.state.global_step == 3


def test_get_train_sampler_override_sets_the_order(make_args: Any) -> None:
    firsts: list[float] = []

    class InOrder(Trainer):
        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            firsts.append(inputs["x"][0, 0].item())
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    data = regression_data(16)
    trainer = _trainer(InOrder, make_args, data=data, per_device_train_batch_size=4, num_train_epochs=1)
    trainer.train()
    assert firsts == pytest.approx([data[i]["x"][0].item() for i in (0, 4, 8, 12)])


def test_eval_and_test_dataloaders_and_eval_sampler_overrides_are_read(make_args: Any) -> None:
    data = regression_data(6, 2)

    class Custom(Trainer):
        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
            return DataLoader(data[:2], batch_size=2, collate_fn=self.data_collator)

        def get_test_dataloader(self, test_dataset: Any) -> DataLoader:
            return DataLoader(test_dataset[:3], batch_size=3, collate_fn=self.data_collator)

        def _get_eval_sampler(self, eval_dataset: Any) -> Any:
            return list(reversed(range(len(eval_dataset))))

    trainer = _trainer(Custom, make_args, eval_data=data)
    plain = _trainer(Trainer, make_args, eval_data=data[:2])
    assert trainer.evaluate()["eval_loss"] == pytest.approx(plain.evaluate()["eval_loss"])
    assert len(trainer.predict(data).predictions) == 3
    del Custom.get_test_dataloader  # the default loader, with the overridden (reversed) sampler
    reversed_preds = trainer.predict(data).predictions
    forward_preds = plain.predict(data).predictions
    assert reversed_preds.tolist() == pytest.approx(forward_preds[::-1].tolist())


def test_signature_columns_override_sets_the_columns_kept(make_args: Any) -> None:
    keys: list[set[str]] = []

    class OnlyX(Trainer):
        def _set_signature_columns_if_needed(self) -> None:
            if self._signature_columns is None:
                self._signature_columns = ["x"]

        def compute_loss(self, model: Any, inputs: dict, return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            keys.append(set(inputs))
            return model(inputs["x"])["logits"].pow(2).mean()

    trainer = _trainer(OnlyX, make_args, max_steps=1)
    assert Trainer._set_signature_columns_if_needed(_trainer(Trainer, make_args)) is None
    trainer.train()
    assert keys == [{"x"}]


def test_collator_with_removed_columns_override_is_the_collator(make_args: Any) -> None:
    class Doubling(Trainer):
        def _get_collator_with_removed_columns(self, data_collator: Any, description: str | None = None) -> Any:
            inner = super()._get_collator_with_removed_columns(data_collator, description)
            return lambda rows: {**inner(rows), "labels": inner(rows)["labels"] * 0 + 9.0}

    trainer = _trainer(Doubling, make_args, max_steps=1, logging_steps=1, learning_rate=0.0)
    trainer.train()
    assert trainer.state.log_history[0]["loss"] > 40  # the targets are 9, not y = x0 - 2 x1 + 0.5


def test_remove_unused_columns_override_is_applied_to_a_datasets_dataset(make_args: Any) -> None:
    datasets = pytest.importorskip("datasets")
    rows = regression_data(16)
    table = datasets.Dataset.from_dict({"x": [r["x"].tolist() for r in rows],
                                        "labels": [r["labels"].item() for r in rows],
                                        "note": ["n"] * 16}).with_format("torch")
    descriptions: list[Any] = []

    class Half(Trainer):
        def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any:
            descriptions.append(description)
            return super()._remove_unused_columns(dataset, description).select(range(8))

    trainer = _trainer(Half, make_args, data=table, per_device_train_batch_size=4, num_train_epochs=1)
    trainer.train()
    assert trainer.state.global_step == 2 and descriptions and descriptions[0] is not None
