"""Stateful callbacks (``ExportableState``) in ``trainer_state.json``: upstream's format, restored like upstream.

With ``restore_callback_states_from_checkpoint=True`` a resume rebuilds each stateful callback from its saved
constructor ``args`` and then sets its saved ``attributes``; states are matched to callbacks by class name, in order,
so several callbacks of one class each get their own. The format is upstream's (``{class name: state}`` or a list of
states for repeats, ``TrainerControl`` last), so checkpoints carry callback states between trainwell and the upstream
``transformers.Trainer`` in both directions; these tests run the real upstream Trainer.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any
from helpers import NormalRows, RegressionModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import trainwell  # noqa: E402
from trainwell.callbacks import ExportableState  # noqa: E402

transformers.logging.set_verbosity_error()


def step_counter_class(lib: Any) -> type:
    """A stateful callback named ``StepCounter`` for ``lib``: constructor arg ``label``, attribute ``steps``."""
    exportable = ExportableState if lib is trainwell else transformers.trainer_callback.ExportableState

    def __init__(self: Any, label: str = "default", every: int = 1) -> None:
        self.label, self.every, self.steps = label, every, 0

    def on_step_end(self: Any, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += self.every

    def state(self: Any) -> dict:
        return {"args": {"label": self.label, "every": self.every}, "attributes": {"steps": self.steps}}

    return type("StepCounter", (lib.TrainerCallback, exportable),
                {"__init__": __init__, "on_step_end": on_step_end, "state": state})


def make_trainer(lib: Any, out: Path, callbacks: list, **overrides: Any) -> Any:
    torch.manual_seed(0)
    extra = {"report_to": "none", "use_cpu": True} if lib is transformers else {}
    kwargs = dict(output_dir=str(out), per_device_train_batch_size=4, max_steps=4, save_steps=2, eval_strategy="steps",
                  eval_steps=2, load_best_model_at_end=True, metric_for_best_model="loss", logging_steps=1,
                  disable_tqdm=True, restore_callback_states_from_checkpoint=True, **extra)
    kwargs.update(overrides)
    return lib.Trainer(model=RegressionModel(3), args=lib.TrainingArguments(**kwargs), train_dataset=NormalRows(),
                       eval_dataset=NormalRows(), callbacks=callbacks)


def saved_callbacks(folder: Path) -> dict:
    return json.loads((folder / "trainer_state.json").read_text())["stateful_callbacks"]


def resume_until_begin(lib: Any, out: Path, folder: Path, callbacks: list) -> Any:
    """Resume from ``folder`` and stop at train begin; returns the trainer (its callbacks are restored by then)."""
    class StopAtBegin(lib.TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            control.should_training_stop = True

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            raise RuntimeError("stop")

    trainer = make_trainer(lib, out, [*callbacks, StopAtBegin()], max_steps=40)
    with pytest.raises(RuntimeError, match="stop"):
        trainer.train(resume_from_checkpoint=str(folder))
    return trainer


def of_type(trainer: Any, name: str) -> list:
    return [cb for cb in trainer.callback_handler.callbacks if type(cb).__name__ == name]


# ------------------------------------------------------------------------------------------------ the format
@pytest.mark.slow  # over a second
def test_stateful_callbacks_are_written_as_upstream_writes_them(tmp_path):
    files = {}
    for lib in (trainwell, transformers):
        counter = step_counter_class(lib)
        trainer = make_trainer(lib, tmp_path / lib.__name__, [lib.EarlyStoppingCallback(5, 0.2), counter("a", 3)])
        trainer.train()
        files[lib.__name__] = saved_callbacks(tmp_path / lib.__name__ / "checkpoint-2")
    assert files["trainwell"] == files["transformers"]
    assert files["trainwell"]["StepCounter"] == {"args": {"label": "a", "every": 3}, "attributes": {"steps": 6}}
    assert files["trainwell"]["EarlyStoppingCallback"]["args"] == {"early_stopping_patience": 5,
                                                                  "early_stopping_threshold": 0.2}
    assert list(files["trainwell"])[-1] == "TrainerControl"


def test_several_callbacks_of_one_class_are_saved_as_a_list_in_order(tmp_path):
    counter = step_counter_class(trainwell)
    make_trainer(trainwell, tmp_path, [counter("first", 1), counter("second", 10)]).train()
    saved = saved_callbacks(tmp_path / "checkpoint-4")["StepCounter"]
    assert saved == [{"args": {"label": "first", "every": 1}, "attributes": {"steps": 4}},
                     {"args": {"label": "second", "every": 10}, "attributes": {"steps": 40}}]
    assert saved_callbacks(tmp_path / "checkpoint-2")["StepCounter"][1]["attributes"] == {"steps": 20}  # per save


# ------------------------------------------------------------------------------------------------ restore
def test_early_stopping_args_and_counter_are_restored(tmp_path):
    first = trainwell.EarlyStoppingCallback(5, 0.2)
    make_trainer(trainwell, tmp_path, [first]).train()
    folder = tmp_path / "checkpoint-4"
    counter = saved_callbacks(folder)["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"]
    assert counter == first.early_stopping_patience_counter
    mine = trainwell.EarlyStoppingCallback()  # default patience 1, threshold 0.0
    trainer = resume_until_begin(trainwell, tmp_path, folder, [mine])
    (restored,) = of_type(trainer, "EarlyStoppingCallback")
    assert restored is mine  # the user's object holds the restored state
    assert (mine.early_stopping_patience, mine.early_stopping_threshold) == (5, 0.2)
    assert mine.early_stopping_patience_counter == counter


def test_repeated_callbacks_are_restored_in_order_and_unknown_ones_reported(tmp_path, caplog):
    counter = step_counter_class(trainwell)
    make_trainer(trainwell, tmp_path, [counter("first", 1), counter("second", 10),
                                       trainwell.EarlyStoppingCallback(3)]).train()
    a, b = counter(), counter()
    trainer = resume_until_begin(trainwell, tmp_path, tmp_path / "checkpoint-2", [a, b])
    assert of_type(trainer, "StepCounter") == [a, b]
    assert (a.label, a.every, a.steps) == ("first", 1, 2)
    assert (b.label, b.every, b.steps) == ("second", 10, 20)
    assert "Ignoring. (EarlyStoppingCallback)" in caplog.text


def test_nothing_is_restored_without_the_flag(tmp_path):
    make_trainer(trainwell, tmp_path, [trainwell.EarlyStoppingCallback(5, 0.2)]).train()
    mine = trainwell.EarlyStoppingCallback()
    trainer = make_trainer(trainwell, tmp_path, [mine], max_steps=40, restore_callback_states_from_checkpoint=False)
    trainer.add_callback(type("Stop", (trainwell.TrainerCallback,), {
        "on_step_begin": lambda self, *a, **k: (_ for _ in ()).throw(RuntimeError("stop"))})())
    with pytest.raises(RuntimeError, match="stop"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    assert mine.early_stopping_patience == 1


# ------------------------------------------------------------------------------------------------ interchange
@pytest.mark.parametrize("writer, reader", [(transformers, trainwell), (trainwell, transformers)],
                         ids=["upstream-to-trainwell", "trainwell-to-upstream"])
@pytest.mark.slow  # over a second
def test_callback_states_cross_between_libraries(tmp_path, writer, reader):
    make_trainer(writer, tmp_path / "w", [writer.EarlyStoppingCallback(5, 0.2), step_counter_class(writer)("x", 2)]
                 ).train()
    out = tmp_path / "r"
    shutil.copytree(tmp_path / "w" / "checkpoint-2", out / "checkpoint-2")
    trainer = resume_until_begin(reader, out, out / "checkpoint-2",
                                 [reader.EarlyStoppingCallback(), step_counter_class(reader)()])
    (early,) = of_type(trainer, "EarlyStoppingCallback")
    (steps,) = of_type(trainer, "StepCounter")
    assert (early.early_stopping_patience, early.early_stopping_threshold) == (5, 0.2)
    assert (steps.label, steps.every, steps.steps) == ("x", 2, 4)
