"""TrainingArguments after its split into args/fields.py (the reference), args/validate.py (``__post_init__``) and
args/runtime.py (the lazily resolved properties): the same public surface as the single module it was."""

from __future__ import annotations

import dataclasses
import pickle

from trainwell import TrainingArguments
from trainwell.args.fields import TrainingArguments as FromFields
from trainwell.args.runtime import RuntimeProperties
from trainwell.args.validate import ArgumentValidation

# dir(TrainingArguments) minus the fields, as it was before the split (commit 1c672e2).
PUBLIC_BEFORE_THE_SPLIT = [
    "ddp_timeout_delta", "device", "eval_batch_size", "get_process_log_level", "get_warmup_steps",
    "local_process_index", "main_process_first", "n_gpu", "parallel_mode", "place_model_on_device", "process_index",
    "set_dataloader", "set_evaluate", "set_logging", "set_lr_scheduler", "set_optimizer", "set_push_to_hub",
    "set_save", "set_testing", "set_training", "should_log", "should_save", "to_dict", "to_json_string",
    "to_sanitized_dict", "train_batch_size", "world_size",
]

# Added since, for the libraries whose configs subclass TrainingArguments under trainwell.patch_transformers() (TRL
# reads args.distributed_state.distributed_type and args.deepspeed_plugin).
ADDED_FOR_LIBRARIES = ["deepspeed_plugin", "distributed_state"]


def test_public_surface_is_unchanged():
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert len(fields) == 151  # 137 + upstream 5.24's activation_checkpointing(_kwargs), ddp_static_graph and its
    # train_sampling_strategy, dataloader_in_order, dataloader_multiprocessing_context, use_cache, project, trackio_*,
    # parallelism_config; trainwell's checkpoint_store and storage_options
    assert sorted(n for n in dir(TrainingArguments) if not n.startswith("_") and n not in fields) == \
        sorted(PUBLIC_BEFORE_THE_SPLIT + ADDED_FOR_LIBRARIES)


def test_the_class_keeps_its_module_so_pickles_load(tmp_path):
    """training_args.bin names trainwell.args.fields.TrainingArguments: the class is still there."""
    assert TrainingArguments is FromFields and TrainingArguments.__module__ == "trainwell.args.fields"
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", learning_rate=3e-4)
    assert b"trainwell.args.fields" in pickle.dumps(args)
    assert pickle.loads(pickle.dumps(args)) == args


def test_validation_and_runtime_are_the_bases_and_fields_only_in_fields():
    assert TrainingArguments.__mro__[1:3] == (ArgumentValidation, RuntimeProperties)
    assert TrainingArguments.__post_init__ is ArgumentValidation.__post_init__
    assert isinstance(vars(RuntimeProperties)["world_size"], property)
    # the bases hold behaviour only: every dataclass field is declared in fields.py
    assert not dataclasses.is_dataclass(ArgumentValidation) and not dataclasses.is_dataclass(RuntimeProperties)
