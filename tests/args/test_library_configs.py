"""TrainingArguments as the base class of the libraries' configs (TRL's SFTConfig, sentence-transformers'
training arguments) under ``trainwell.patch_transformers()``: the members they read, and a dataclass subclass with
its own dict fields, no transformers needed."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from trainwell import TrainingArguments


@dataclass
class LibraryConfig(TrainingArguments):
    """The shape of TRL's configs: new fields with defaults, an extended ``_VALID_DICT_FIELDS``."""

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + ["model_init_kwargs", "prompts"]
    model_init_kwargs: dict | str | None = None
    prompts: dict | str | None = None
    warmup_ratio: float | None = field(default=None)  # sentence-transformers' redefinition on transformers 5


def test_subclass_dict_fields_are_parsed_from_json_objects_only(tmp_path):
    args = LibraryConfig(str(tmp_path), model_init_kwargs='{"dtype": "float32"}', prompts="query: ",
                         lr_scheduler_kwargs='{"num_cycles": 2}')
    assert args.model_init_kwargs == {"dtype": "float32"}
    assert args.prompts == "query: "  # a plain string the library reads itself
    assert args.lr_scheduler_kwargs == {"num_cycles": 2}


def test_warmup_ratio_none_means_no_warmup(tmp_path):
    args = LibraryConfig(str(tmp_path))
    assert args.warmup_ratio is None and args.get_warmup_steps(100) == 0
    assert LibraryConfig(str(tmp_path), warmup_steps=0.1).get_warmup_steps(100) == 10


def test_use_configured_state_is_accepted(tmp_path):
    args = TrainingArguments(str(tmp_path), accelerator_config={"use_configured_state": True})
    assert args.accelerator_config == {"use_configured_state": True}
    with pytest.raises(NotImplementedError, match="split_batches"):
        TrainingArguments(str(tmp_path), accelerator_config={"split_batches": True})


def test_distributed_state_and_deepspeed_plugin(tmp_path):
    args = TrainingArguments(str(tmp_path), use_cpu=True)
    state = args.distributed_state
    assert state.distributed_type == "NO" and state.num_processes == 1 and state.process_index == 0
    assert state.is_main_process and str(state.device) == "cpu"
    assert args.deepspeed_plugin is None
