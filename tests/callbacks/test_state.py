"""Tests for trainwell.utils.trainer_state: TrainerState json round-trip, compute_steps, TrainerControl flags."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from trainwell.utils.trainer_state import ExportableState, TrainerControl, TrainerState


def test_json_round_trip_keeps_history_and_best(tmp_path):
    state = TrainerState(epoch=1.5, global_step=30, max_steps=40, train_batch_size=8, num_train_epochs=2)
    state.log_history = [{"loss": 0.5, "step": 10}, {"eval_loss": 0.25, "epoch": 1.0, "step": 20}]
    state.best_metric = 0.25
    state.best_global_step = 20
    state.best_model_checkpoint = "out/checkpoint-20"
    state.trial_params = {"lr": 0.001}
    path = tmp_path / "trainer_state.json"
    state.save_to_json(path)

    text = path.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    keys = list(json.loads(text))
    assert keys == sorted(keys)
    assert '\n  "best_metric": 0.25' in text  # indented two spaces

    loaded = TrainerState.load_from_json(path)
    assert loaded == state
    assert loaded.log_history[1]["eval_loss"] == 0.25
    assert loaded.best_model_checkpoint == "out/checkpoint-20"


def test_load_ignores_unknown_keys(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"global_step": 7, "some_future_field": 1}), encoding="utf-8")
    loaded = TrainerState.load_from_json(path)
    assert loaded.global_step == 7
    assert loaded.log_history == [] and loaded.stateful_callbacks == {}


def test_load_damaged_file_names_it(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match="trainer_state.json"):
        TrainerState.load_from_json(path)


def test_defaults_are_fresh_lists():
    a, b = TrainerState(), TrainerState()
    a.log_history.append({"loss": 1.0})
    assert b.log_history == []
    assert TrainerState(log_history=None).log_history == []


@pytest.mark.parametrize(
    ("logging", "eval_", "save", "expected"),
    [
        (0.1, 0.25, 0.5, (10, 25, 50)),
        (0.015, 1, 40, (2, 1, 40)),  # ceil(1.5) == 2
        (5, None, 0.333, (5, 500, 34)),  # None keeps the current value
    ],
)
def test_compute_steps(logging, eval_, save, expected):
    state = TrainerState()
    args = SimpleNamespace(logging_steps=logging, eval_steps=eval_, save_steps=save)
    state.compute_steps(args, max_steps=100)
    assert (state.logging_steps, state.eval_steps, state.save_steps) == expected
    assert all(isinstance(v, int) for v in expected)


def test_control_resets():
    control = TrainerControl(True, True, True, True, True)
    control._new_step()
    assert (control.should_save, control.should_evaluate, control.should_log) == (False, False, False)
    assert control.should_epoch_stop and control.should_training_stop
    control._new_epoch()
    assert not control.should_epoch_stop and control.should_training_stop
    control._new_training()
    assert not control.should_training_stop


def test_control_exportable_round_trip():
    control = TrainerControl(should_training_stop=True, should_log=True)
    exported = control.state()
    assert exported["args"]["should_training_stop"] is True and exported["attributes"] == {}
    assert TrainerControl.from_state(exported) == control


class _Counter(ExportableState):
    def __init__(self, patience: int = 1) -> None:
        self.patience = patience
        self.count = 0

    def state(self):
        return {"args": {"patience": self.patience}, "attributes": {"count": self.count}}


def test_stateful_callbacks_exported_by_class_name(tmp_path):
    first, second = _Counter(2), _Counter(3)
    second.count = 5
    state = TrainerState(stateful_callbacks=[first, TrainerControl(should_save=True), second])
    assert state.stateful_callbacks["_Counter"] == [first.state(), second.state()]
    assert state.stateful_callbacks["TrainerControl"]["args"]["should_save"] is True
    state.save_to_json(tmp_path / "s.json")
    loaded = TrainerState.load_from_json(tmp_path / "s.json")
    rebuilt = _Counter.from_state(loaded.stateful_callbacks["_Counter"][1])
    assert (rebuilt.patience, rebuilt.count) == (3, 5)


def test_stateful_callbacks_rejects_plain_objects():
    with pytest.raises(TypeError, match="ExportableState"):
        TrainerState(stateful_callbacks=[object()])
