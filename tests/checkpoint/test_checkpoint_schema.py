"""trainer_state.json is checked against the TrainerState schema before anything of a checkpoint is applied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainwell import Trainer, TrainingArguments
from trainwell.checkpoint.digest import hash_file
from trainwell.checkpoint.layout import COMPLETE_MARKER, CheckpointError, read_marker
from trainwell.utils.trainer_state import TrainerState, trainer_state_problems

from helpers import RegressionModel, regression_data


def make_trainer(out: Path, **overrides) -> Trainer:
    kwargs = dict(output_dir=str(out), per_device_train_batch_size=4, max_steps=4, save_steps=2, disable_tqdm=True,
                  report_to="none", logging_steps=1)
    kwargs.update(overrides)
    torch.manual_seed(0)
    return Trainer(model=RegressionModel(), args=TrainingArguments(**kwargs), train_dataset=regression_data(16))


def damage_state(folder: Path, edit) -> None:
    """Rewrite trainer_state.json with ``edit(data)`` and keep the marker's record of it (size, checksum) consistent."""
    path = folder / "trainer_state.json"
    data = json.loads(path.read_text())
    data = edit(data)
    path.write_text(json.dumps(data, indent=2))
    record = read_marker(folder)
    algorithm = record["checksum"]  # the marker agrees with the new file: only the schema is off
    record["files"]["trainer_state.json"] = {"size": path.stat().st_size, algorithm: hash_file(path, algorithm).digest}
    (folder / COMPLETE_MARKER).write_text(json.dumps(record))


def _set(key, value):
    def edit(data):
        data[key] = value
        return data
    return edit


def _drop(key):
    def edit(data):
        del data[key]
        return data
    return edit


BROKEN = {
    "not_an_object": (lambda data: [data], r"expected a JSON object of TrainerState fields, found list"),
    "step_is_text": (_set("global_step", "ten"), r"'global_step' must be an integer >= 0, found 'ten'"),
    "step_negative": (_set("global_step", -4), r"'global_step' must be an integer >= 0"),
    "step_missing": (_drop("global_step"), r"'global_step' is missing"),
    "step_is_bool": (_set("global_step", True), r"'global_step' must be an integer"),
    "history_not_list": (_set("log_history", {"loss": 1.0}), r"'log_history' must be a list of objects"),
    "history_items": (_set("log_history", [1, 2]), r"'log_history' must be a list of objects"),
    "best_metric_text": (_set("best_metric", "low"), r"'best_metric' must be a number or null"),
    "flag_text": (_set("is_world_process_zero", "yes"), r"'is_world_process_zero' must be true or false"),
    "callbacks_list": (_set("stateful_callbacks", [{"args": {}}]), r"'stateful_callbacks' must be an object"),
    "callback_args": (_set("stateful_callbacks", {"EarlyStoppingCallback": {"args": 5}}),
                      r"'stateful_callbacks' must be an object"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_wrong_schema_is_a_clear_error_before_anything_is_loaded(tmp_path, case):
    make_trainer(tmp_path).train()
    edit, message = BROKEN[case]
    damage_state(tmp_path / "checkpoint-4", edit)
    trainer = make_trainer(tmp_path, max_steps=6)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"checkpoint-4/trainer_state\.json: not a valid trainer state \(.*"
                                              + message):
        trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the weights were not touched


def test_resume_true_falls_back_past_a_wrong_schema(tmp_path):
    make_trainer(tmp_path).train()
    damage_state(tmp_path / "checkpoint-4", _set("log_history", "gone"))
    make_trainer(tmp_path / "ref").train()
    reference = make_trainer(tmp_path / "ref", max_steps=6)
    reference.train(resume_from_checkpoint=str(tmp_path / "ref" / "checkpoint-2"))
    trainer = make_trainer(tmp_path, max_steps=6)
    with pytest.warns(UserWarning, match=r"checkpoint-4 is damaged .*trainer_state\.json: not a valid trainer state"
                                         r".*falling back to .*checkpoint-2"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 6
    for key, value in reference.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[key])  # the same as resuming from checkpoint-2 by path


def test_unknown_keys_are_accepted_for_newer_versions(tmp_path):
    make_trainer(tmp_path).train()
    damage_state(tmp_path / "checkpoint-4", _set("some_future_field", {"x": 1}))
    trainer = make_trainer(tmp_path, max_steps=5)
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 5


def test_load_from_json_names_the_file_and_field(tmp_path):
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 3, "epoch": "one"}))
    with pytest.raises(ValueError, match=r"trainer_state\.json is not a valid trainer state \('epoch' must be a "
                                         r"number or null, found 'one'\)"):
        TrainerState.load_from_json(path)
    TrainerState(global_step=3, epoch=0.5).save_to_json(path)
    assert TrainerState.load_from_json(path).epoch == 0.5


def test_the_states_trainwell_writes_pass():
    state = TrainerState(global_step=2, best_metric=0.5, best_global_step=2, trial_params={"lr": 0.1},
                         log_history=[{"loss": 1.0, "step": 1}],
                         stateful_callbacks={"A": {"args": {"x": 1}, "attributes": {}}, "B": [{"args": {}}, {}]})
    assert trainer_state_problems(json.loads(json.dumps(state.to_dict()))) == []
