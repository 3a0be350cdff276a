"""A script written for the upstream Trainer API ports by changing one import: same defaults, names and behaviour.

Each test pins one upstream behaviour (the seed docs first, modern upstream where they are silent) that trainwell
once differed on, or a public surface a ported script relies on.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import trainwell
from trainwell import HfArgumentParser, TrainerCallback, TrainerControl, TrainerState, TrainingArguments


def make(tmp_path, **kwargs) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), **kwargs)


# ------------------------------------------------------------------------------------ TrainingArguments defaults
# The defaults of the seed docs' TrainingArguments signature (older upstream), minus the known deliberate
# differences (report_to, skip_memory_metrics).
SEED_DEFAULTS = {
    "overwrite_output_dir": False, "do_train": False, "do_eval": False, "do_predict": False,
    "prediction_loss_only": False, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 1, "eval_accumulation_steps": None, "learning_rate": 5e-05,
    "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-08, "max_grad_norm": 1.0,
    "num_train_epochs": 3.0, "max_steps": -1, "warmup_ratio": 0.0, "warmup_steps": 0, "logging_first_step": False,
    "logging_steps": 500, "save_steps": 500, "save_total_limit": None, "seed": 42, "fp16": False,
    "fp16_full_eval": False, "local_rank": -1, "dataloader_drop_last": False, "eval_steps": None,
    "dataloader_num_workers": 0, "past_index": -1, "remove_unused_columns": True, "label_names": None,
    "load_best_model_at_end": False, "metric_for_best_model": None, "greater_is_better": None,
    "ignore_data_skip": False, "deepspeed": None, "label_smoothing_factor": 0.0, "group_by_length": False,
    "length_column_name": "length", "ddp_find_unused_parameters": None, "dataloader_pin_memory": True,
    "push_to_hub": False, "resume_from_checkpoint": None,
}


def test_seed_defaults(tmp_path):
    args = make(tmp_path)
    got = {name: getattr(args, name) for name in SEED_DEFAULTS}
    assert got == SEED_DEFAULTS
    assert args.eval_strategy == "no" and args.logging_strategy == "steps" and args.save_strategy == "steps"
    assert args.lr_scheduler_type == "linear"


# ------------------------------------------------------------------------------------ warmup_steps as a ratio
def test_warmup_steps_below_one_is_a_ratio_of_the_run(tmp_path):
    # modern upstream: warmup_steps=0.1 means 10% of the steps (it used to give a 0.1-step warmup here)
    args = make(tmp_path, warmup_steps=0.1)
    assert args.get_warmup_steps(95) == 10
    assert args.get_warmup_steps(100) == 10


def test_integer_warmup_steps_stay_integers(tmp_path):
    args = make(tmp_path, warmup_steps=7.0, warmup_ratio=0.5)
    assert args.warmup_steps == 7 and isinstance(args.warmup_steps, int)
    assert args.get_warmup_steps(1000) == 7
    with pytest.raises(ValueError, match=r"warmup_steps=2.5 must be an integer when >= 1"):
        make(tmp_path, warmup_steps=2.5)


def test_warmup_steps_ratio_from_the_command_line(tmp_path):
    parser = HfArgumentParser(TrainingArguments)
    (ratio,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--warmup_steps", "0.05"])
    assert ratio.warmup_steps == 0.05 and ratio.get_warmup_steps(200) == 10
    (steps,) = parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--warmup_steps", "12"])
    assert steps.warmup_steps == 12 and isinstance(steps.warmup_steps, int)


def test_set_lr_scheduler_accepts_a_warmup_ratio(tmp_path):
    args = make(tmp_path).set_lr_scheduler(name="cosine", warmup_steps=0.05)
    assert args.warmup_steps == 0.05 and args.get_warmup_steps(100) == 5


# ------------------------------------------------------------------------------------ derived values
def test_eval_steps_zero_falls_back_to_logging_steps(tmp_path):
    # upstream treats eval_steps=0 like "unset" (it used to raise here)
    args = make(tmp_path, eval_strategy="steps", eval_steps=0, logging_steps=7)
    assert args.eval_steps == 7 and args.do_eval is True


def test_reduce_on_plateau_tracks_loss_by_default(tmp_path):
    args = make(tmp_path, lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch")
    assert args.metric_for_best_model == "loss"
    assert args.greater_is_better is False
    explicit = make(tmp_path, lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch",
                    metric_for_best_model="accuracy")
    assert explicit.metric_for_best_model == "accuracy" and explicit.greater_is_better is True


def test_use_cpu_turns_off_pinned_memory(tmp_path):
    assert make(tmp_path, use_cpu=True).dataloader_pin_memory is False
    assert make(tmp_path).dataloader_pin_memory is True


# ------------------------------------------------------------------------------------ public names
@pytest.mark.parametrize("name", ["DefaultDataCollator", "DataCollatorForTokenClassification"])
def test_collators_importable_from_the_top_level(name):
    from trainwell.data import collators

    assert getattr(trainwell, name) is getattr(collators, name)
    assert name in trainwell.__all__


def test_default_data_collator_class_renames_label():
    batch = trainwell.DefaultDataCollator()([{"x": [1, 2], "label": 1}, {"x": [3, 4], "label": 0}])
    assert torch.equal(batch["labels"], torch.tensor([1, 0]))
    assert torch.equal(batch["x"], torch.tensor([[1, 2], [3, 4]]))


def test_token_classification_collator_pads_labels_with_minus_100():
    class Tok:
        pad_token_id = 0
        padding_side = "right"
        model_input_names = ["input_ids", "attention_mask"]

    collate = trainwell.DataCollatorForTokenClassification(Tok())
    batch = collate([{"input_ids": [5, 6, 7], "labels": [1, 2, 1]}, {"input_ids": [8], "labels": [2]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[1, 2, 1], [2, -100, -100]]


UPSTREAM_EVENTS = [
    "on_init_end", "on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end", "on_step_begin",
    "on_pre_optimizer_step", "on_optimizer_step", "on_substep_end", "on_step_end", "on_evaluate", "on_predict",
    "on_save", "on_log", "on_prediction_step",
]


def test_callback_events_and_state_fields_match_upstream():
    assert all(callable(getattr(TrainerCallback, name)) for name in UPSTREAM_EVENTS)
    state_fields = {f.name for f in dataclasses.fields(TrainerState)}
    assert {"epoch", "global_step", "max_steps", "logging_steps", "eval_steps", "save_steps", "train_batch_size",
            "num_train_epochs", "num_input_tokens_seen", "total_flos", "log_history", "best_metric",
            "best_global_step", "best_model_checkpoint", "is_local_process_zero", "is_world_process_zero",
            "is_hyper_param_search", "trial_name", "trial_params", "stateful_callbacks"} <= state_fields
    assert [f.name for f in dataclasses.fields(TrainerControl)] == [
        "should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log"]


def test_trainer_public_methods_keep_upstream_parameter_names():
    from trainwell import Trainer

    expected = {
        "train": ["resume_from_checkpoint", "trial", "ignore_keys_for_eval"],
        "evaluate": ["eval_dataset", "ignore_keys", "metric_key_prefix"],
        "predict": ["test_dataset", "ignore_keys", "metric_key_prefix"],
        "compute_loss": ["model", "inputs", "return_outputs", "num_items_in_batch"],
        "training_step": ["model", "inputs", "num_items_in_batch"],
        "prediction_step": ["model", "inputs", "prediction_loss_only", "ignore_keys"],
        "create_optimizer_and_scheduler": ["num_training_steps"],
        "create_scheduler": ["num_training_steps", "optimizer"],
        "get_eval_dataloader": ["eval_dataset"],
        "get_test_dataloader": ["test_dataset"],
        "save_model": ["output_dir", "_internal_call"],
        "log_metrics": ["split", "metrics"],
        "save_metrics": ["split", "metrics", "combined"],
        "add_callback": ["callback"],
        "pop_callback": ["callback"],
        "remove_callback": ["callback"],
    }
    for method, names in expected.items():
        params = [p for p in inspect.signature(getattr(Trainer, method)).parameters if p not in ("self", "kwargs")]
        assert params[: len(names)] == names, method


def test_trainer_utils_helpers_import_from_their_upstream_home():
    from trainwell.trainer_utils import (HPSearchBackend, default_compute_objective, denumpify_detensorize,
                                         has_length, speed_metrics)

    assert HPSearchBackend("optuna").value == "optuna"
    assert default_compute_objective({"eval_loss": 0.5, "epoch": 1.0}) == 0.5
    assert has_length([1, 2]) and not has_length(iter([1]))
    assert "test_runtime" in speed_metrics("test", 0.0)
    assert denumpify_detensorize({"a": __import__("numpy").float32(1.5)}) == {"a": 1.5}
