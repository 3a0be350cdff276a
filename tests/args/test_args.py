"""Tests of ``TrainingArguments`` / ``Seq2SeqTrainingArguments``: defaults, deprecations, validation, serialisation
and the lazily resolved runtime properties (on the CPU, with and without a launcher's environment)."""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import warnings
from dataclasses import fields
from datetime import timedelta
from pathlib import Path

import pytest

from trainwell.args.fields import REPORT_TO_INTEGRATIONS, DebugOption, TrainingArguments
from trainwell.args.seq2seq import Seq2SeqTrainingArguments
from trainwell.trainer_utils import (
    FSDPOption,
    HubStrategy,
    IntervalStrategy,
    OptimizerNames,
    ParallelMode,
    SaveStrategy,
    SchedulerType,
    ShardedDDPOption,
)
from helpers.launch import ROOT

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
               "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE")


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def transformers_logging_not_loaded(monkeypatch):
    """"passive" levels as in a script that never loaded transformers' logging (other test modules turn
    transformers' verbosity down, which "passive" would otherwise follow, as upstream does)."""
    monkeypatch.setitem(sys.modules, "transformers.utils.logging", None)


def make(tmp_path: Path | None = None, **kwargs) -> TrainingArguments:
    """Build arguments with every warning turned into an error (so no stray deprecation goes unnoticed)."""
    kwargs.setdefault("output_dir", str(tmp_path or "unused_out"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return TrainingArguments(**kwargs)


# ------------------------------------------------------------------ fields and defaults
REQUIRED = """output_dir overwrite_output_dir do_train do_eval do_predict eval_strategy evaluation_strategy
prediction_loss_only per_device_train_batch_size per_device_eval_batch_size per_gpu_train_batch_size
per_gpu_eval_batch_size gradient_accumulation_steps eval_accumulation_steps eval_delay torch_empty_cache_steps
learning_rate weight_decay adam_beta1 adam_beta2 adam_epsilon max_grad_norm num_train_epochs max_steps
lr_scheduler_type lr_scheduler_kwargs warmup_ratio warmup_steps log_level log_level_replica log_on_each_node
logging_dir logging_strategy logging_first_step logging_steps logging_nan_inf_filter save_strategy save_steps
save_total_limit save_safetensors save_on_each_node save_only_model restore_callback_states_from_checkpoint no_cuda
use_cpu use_mps_device seed data_seed jit_mode_eval bf16 fp16 fp16_opt_level half_precision_backend bf16_full_eval
fp16_full_eval tf32 local_rank ddp_backend tpu_num_cores dataloader_drop_last eval_steps dataloader_num_workers
dataloader_prefetch_factor past_index run_name disable_tqdm remove_unused_columns label_names load_best_model_at_end
metric_for_best_model greater_is_better ignore_data_skip fsdp fsdp_min_num_params fsdp_config
fsdp_transformer_layer_cls_to_wrap sharded_ddp deepspeed label_smoothing_factor optim optim_args adafactor
group_by_length length_column_name report_to ddp_find_unused_parameters ddp_bucket_cap_mb ddp_broadcast_buffers
ddp_timeout dataloader_pin_memory dataloader_persistent_workers skip_memory_metrics use_legacy_prediction_loop
push_to_hub hub_model_id hub_strategy hub_token hub_private_repo hub_always_push resume_from_checkpoint
gradient_checkpointing gradient_checkpointing_kwargs include_inputs_for_metrics include_for_metrics
eval_do_concat_batches fp16_backend full_determinism torch_compile torch_compile_backend torch_compile_mode
neftune_noise_alpha batch_eval_metrics eval_on_start use_liger_kernel eval_use_gather_object
average_tokens_across_devices auto_find_batch_size debug mp_parameters include_tokens_per_second
include_num_input_tokens_seen accelerator_config dispatch_batches split_batches""".split()


def test_every_documented_field_exists_with_help_text():
    by_name = {f.name: f for f in fields(TrainingArguments)}
    missing = [n for n in REQUIRED if n not in by_name]
    assert missing == []
    no_help = [f.name for f in fields(TrainingArguments) if not f.metadata.get("help")]
    assert no_help == []
    assert by_name["log_level"].metadata["choices"] == ["detail", "debug", "info", "warning", "error", "critical", "passive"]


def test_defaults_match_upstream(tmp_path):
    args = make(tmp_path)
    assert TrainingArguments().output_dir == "trainer_output"
    assert (args.per_device_train_batch_size, args.per_device_eval_batch_size) == (8, 8)
    assert args.learning_rate == 5e-5 and args.num_train_epochs == 3.0 and args.max_steps == -1
    assert args.optim == OptimizerNames.ADAMW_TORCH_FUSED and args.optim == "adamw_torch_fused"  # torch >= 2.8
    assert args.lr_scheduler_type == SchedulerType.LINEAR and args.lr_scheduler_kwargs == {}
    assert args.eval_strategy == IntervalStrategy.NO and args.do_eval is False
    assert args.logging_strategy == IntervalStrategy.STEPS and args.logging_steps == 500
    assert args.save_strategy == SaveStrategy.STEPS and args.save_steps == 500
    assert args.hub_strategy == HubStrategy.EVERY_SAVE
    assert args.report_to == [] and args.fsdp == [] and args.sharded_ddp == [] and args.debug == []
    assert args.save_safetensors is True and args.skip_memory_metrics is True
    assert args.ddp_timeout == 1800 and args.ddp_timeout_delta == timedelta(seconds=1800)
    assert args.log_level == "passive" and args.log_level_replica == "warning"
    assert args.disable_tqdm is False and args.run_name == str(tmp_path)
    assert args.include_for_metrics == [] and args.eval_steps is None
    assert args.metric_for_best_model is None and args.greater_is_better is None


def test_logging_dir_is_computed_but_not_created(tmp_path):
    out = tmp_path / "out"
    args = make(out)
    runs = os.path.join(str(out), "runs")
    assert args.logging_dir.startswith(runs + os.sep)
    assert args.logging_dir.endswith("_" + socket.gethostname())
    assert not out.exists()
    assert make(tmp_path, logging_dir="~/tb").logging_dir == os.path.expanduser("~/tb")


def test_output_dir_none_means_trainer_output():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TrainingArguments(output_dir=None).output_dir == "trainer_output"


# ------------------------------------------------------------------ enums
@pytest.mark.parametrize("name,value,member", [
    ("eval_strategy", "epoch", IntervalStrategy.EPOCH),
    ("logging_strategy", "no", IntervalStrategy.NO),
    ("save_strategy", "epoch", SaveStrategy.EPOCH),
    ("lr_scheduler_type", "cosine", SchedulerType.COSINE),
    ("optim", "sgd", OptimizerNames.SGD),
    ("hub_strategy", "checkpoint", HubStrategy.CHECKPOINT),
])
def test_strings_become_enums(tmp_path, name, value, member):
    args = make(tmp_path, **{name: value})
    assert getattr(args, name) is member


@pytest.mark.parametrize("name", ["eval_strategy", "logging_strategy", "save_strategy", "lr_scheduler_type",
                                  "optim", "hub_strategy"])
def test_invalid_enum_value_names_field_and_choices(tmp_path, name):
    with pytest.raises(ValueError, match=name) as err:
        make(tmp_path, **{name: "bogus"})
    assert "'bogus'" in str(err.value) and "choose one of" in str(err.value)


def test_debug_words_become_options(tmp_path):
    assert make(tmp_path, debug="underflow_overflow").debug == [DebugOption.UNDERFLOW_OVERFLOW]
    with pytest.raises(ValueError, match="debug"):
        make(tmp_path, debug="verbose")


# ------------------------------------------------------------------ deprecations
@pytest.mark.parametrize("kwargs,attr,expected", [
    ({"evaluation_strategy": "epoch"}, "eval_strategy", IntervalStrategy.EPOCH),
    ({"no_cuda": True}, "use_cpu", True),
    ({"per_gpu_train_batch_size": 4}, "per_device_train_batch_size", 4),
    ({"per_gpu_eval_batch_size": 3}, "per_device_eval_batch_size", 3),
    ({"fp16_backend": "apex"}, "half_precision_backend", "apex"),
    ({"fp16_backend": "amp"}, "half_precision_backend", "auto"),
    ({"adafactor": True}, "optim", OptimizerNames.ADAFACTOR),
    ({"include_inputs_for_metrics": True}, "include_for_metrics", ["inputs"]),
    ({"torchdynamo": "eager"}, "torch_compile_backend", "eager"),
    ({"push_to_hub_token": "secret"}, "hub_token", "secret"),
    ({"push_to_hub_model_id": "m"}, "hub_model_id", "m"),
    # tpu_metrics_debug maps to debug='tpu_metrics_debug', then needs torch_xla: see tests/test_no_stub_fields.py
    ({"dispatch_batches": False}, "accelerator_config", {"dispatch_batches": False}),
    ({"split_batches": False}, "accelerator_config", {"split_batches": False}),
    ({"use_mps_device": True}, "use_mps_device", False),
])
def test_deprecated_spellings_warn_and_map(tmp_path, kwargs, attr, expected):
    with pytest.warns(FutureWarning, match=next(iter(kwargs))):
        args = TrainingArguments(output_dir=str(tmp_path), **kwargs)
    assert getattr(args, attr) == expected


def test_deprecated_fields_are_reset_after_mapping(tmp_path):
    with pytest.warns(FutureWarning):
        args = TrainingArguments(output_dir=str(tmp_path), evaluation_strategy="steps", no_cuda=True,
                                 per_gpu_train_batch_size=2, adafactor=True)
    assert (args.evaluation_strategy, args.no_cuda, args.per_gpu_train_batch_size, args.adafactor) == (
        None, False, None, False)
    assert args.train_batch_size == 2 and args.do_eval is True and args.eval_steps == 500


def test_torchdynamo_turns_on_torch_compile(tmp_path):
    with pytest.warns(FutureWarning):
        args = TrainingArguments(output_dir=str(tmp_path), torchdynamo="eager")
    assert args.torch_compile is True and args.torchdynamo is None


def test_push_to_hub_organization_builds_model_id(tmp_path):
    with pytest.warns(FutureWarning, match="push_to_hub_organization"):
        args = TrainingArguments(output_dir=str(tmp_path / "my-model"), push_to_hub_organization="acme")
    assert args.hub_model_id == "acme/my-model"


@pytest.mark.parametrize("value,fsdp,sharded", [
    ("zero_dp_2", [FSDPOption.SHARD_GRAD_OP], []),
    ("zero_dp_3", [FSDPOption.FULL_SHARD], []),
    ("zero_dp_3 offload auto_wrap", [FSDPOption.FULL_SHARD, FSDPOption.OFFLOAD, FSDPOption.AUTO_WRAP], []),
    ("simple", [], [ShardedDDPOption.SIMPLE]),
    (True, [], [ShardedDDPOption.SIMPLE]),
])
def test_sharded_ddp_maps_to_fsdp_or_stays_simple(tmp_path, value, fsdp, sharded):
    with pytest.warns(FutureWarning, match="sharded_ddp"):
        args = TrainingArguments(output_dir=str(tmp_path), sharded_ddp=value)
    assert args.fsdp == fsdp and args.sharded_ddp == sharded


@pytest.mark.parametrize("value,match", [
    ("offload", "offload/auto_wrap need zero_dp_2 or zero_dp_3"),
    ("simple zero_dp_2", "simple' cannot be combined"),
    ("zero_dp_2 zero_dp_3", "exclude each other"),
    ("zero_dp_9", "sharded_ddp='zero_dp_9' is not valid"),
])
def test_sharded_ddp_invalid_combinations(tmp_path, value, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        with pytest.raises(ValueError, match=match):
            TrainingArguments(output_dir=str(tmp_path), sharded_ddp=value)


def test_fsdp_transformer_layer_cls_to_wrap_moves_into_config(tmp_path):
    with pytest.warns(FutureWarning, match="fsdp_transformer_layer_cls_to_wrap"):
        args = TrainingArguments(output_dir=str(tmp_path), fsdp="full_shard auto_wrap",
                                 fsdp_transformer_layer_cls_to_wrap="Block")
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["Block"]


def test_default_construction_emits_no_warning(tmp_path):
    make(tmp_path)  # make() turns warnings into errors


# ------------------------------------------------------------------ derived defaults
def test_eval_steps_default_to_logging_steps_and_do_eval(tmp_path):
    args = make(tmp_path, eval_strategy="steps", logging_steps=20)
    assert args.eval_steps == 20 and args.do_eval is True
    assert make(tmp_path, eval_strategy="epoch").do_eval is True
    assert make(tmp_path, eval_strategy="steps", eval_steps=7).eval_steps == 7


@pytest.mark.parametrize("level,disabled", [("error", True), ("critical", True), ("warning", False),
                                            ("info", False), ("passive", False)])
def test_disable_tqdm_follows_log_level(tmp_path, level, disabled):
    assert make(tmp_path, log_level=level).disable_tqdm is disabled
    assert make(tmp_path, log_level=level, disable_tqdm=not disabled).disable_tqdm is (not disabled)


@pytest.mark.parametrize("metric,greater", [(None, False), ("loss", False), ("eval_loss", False),
                                            ("accuracy", True), ("eval_f1", True)])
def test_best_model_metric_defaults(tmp_path, metric, greater):
    args = make(tmp_path, load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch",
                metric_for_best_model=metric)
    assert args.metric_for_best_model == (metric or "loss") and args.greater_is_better is greater
    explicit = make(tmp_path, metric_for_best_model="perplexity", greater_is_better=False)
    assert explicit.greater_is_better is False


def test_save_strategy_best(tmp_path):
    with pytest.raises(ValueError, match="metric_for_best_model"):
        make(tmp_path, save_strategy="best", eval_strategy="epoch")
    args = make(tmp_path, save_strategy="best", eval_strategy="steps", eval_steps=10,
                metric_for_best_model="accuracy", load_best_model_at_end=True)
    assert args.save_strategy == SaveStrategy.BEST and args.greater_is_better is True


@pytest.mark.parametrize("name", ["logging_steps", "eval_steps", "save_steps"])
def test_fractional_steps(tmp_path, name):
    kw = {"eval_strategy": "steps"} if name == "eval_steps" else {}
    args = make(tmp_path, **kw, **{name: 0.25})
    assert getattr(args, name) == 0.25 and isinstance(getattr(args, name), float)
    whole = make(tmp_path, **kw, **{name: 10.0})
    assert getattr(whole, name) == 10 and isinstance(getattr(whole, name), int)
    with pytest.raises(ValueError, match=f"{name}=1.5 must be an integer"):
        make(tmp_path, **kw, **{name: 1.5})
    with pytest.raises(ValueError, match=f"{name}=-1 must be >= 0"):
        make(tmp_path, **kw, **{name: -1})


def test_torch_compile_mode_implies_compile_with_inductor(tmp_path):
    args = make(tmp_path, torch_compile_mode="reduce-overhead")
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"
    assert make(tmp_path, torch_compile=True).torch_compile_backend == "inductor"


def test_local_rank_follows_launcher_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert make(tmp_path, local_rank=-1).local_rank == 2


# ------------------------------------------------------------------ dict / json fields
def test_json_strings_are_parsed(tmp_path):
    args = make(tmp_path, lr_scheduler_kwargs='{"num_cycles": 2}', activation_checkpointing_kwargs='{"a": 1}',
                deepspeed='{"train_batch_size": "auto"}')
    assert args.lr_scheduler_kwargs == {"num_cycles": 2}
    assert args.activation_checkpointing_kwargs == args.gradient_checkpointing_kwargs == {"a": 1}  # the alias mirrors
    assert args.deepspeed == {"train_batch_size": "auto"}
    with pytest.raises(ValueError, match="lr_scheduler_kwargs is not valid JSON"):
        make(tmp_path, lr_scheduler_kwargs="{num_cycles: 2}")
    with pytest.raises(ValueError, match="lr_scheduler_kwargs='num_cycles=2' must be a dict"):
        make(tmp_path, lr_scheduler_kwargs="num_cycles=2")


def test_fsdp_config_from_file_strips_prefix(tmp_path):
    path = tmp_path / "fsdp.json"
    path.write_text(json.dumps({"fsdp_min_num_params": 100, "xla": False}))
    args = make(tmp_path, fsdp="full_shard", fsdp_config=str(path))
    assert args.fsdp == [FSDPOption.FULL_SHARD]
    assert args.fsdp_config == {"min_num_params": 100, "xla": False}
    assert make(tmp_path, fsdp=True).fsdp == [FSDPOption.FULL_SHARD]
    with pytest.raises(ValueError, match="fsdp_config=.*file not found"):
        make(tmp_path, fsdp="full_shard", fsdp_config=str(tmp_path / "missing.json"))


def test_deepspeed_path_is_checked_and_kept(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text('{"zero_optimization": {"stage": 2}}')
    assert make(tmp_path, deepspeed=str(good)).deepspeed == str(good)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="deepspeed file .* is not valid JSON"):
        make(tmp_path, deepspeed=str(bad))
    with pytest.raises(ValueError, match="deepspeed=.*file not found"):
        make(tmp_path, deepspeed=str(tmp_path / "nope.json"))


# ------------------------------------------------------------------ validation errors
CPU_ONLY = pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only behaviour")


@pytest.mark.parametrize("kwargs,match", [
    ({"fp16": True, "bf16": True}, r"fp16=True and bf16=True"),
    ({"fp16_full_eval": True, "bf16_full_eval": True}, r"fp16_full_eval=True and bf16_full_eval=True"),
    ({"per_device_train_batch_size": 0}, r"per_device_train_batch_size must be a positive.*got "
                                         r"per_device_train_batch_size=0"),
    ({"per_device_eval_batch_size": -2}, r"per_device_eval_batch_size must be a positive"),
    ({"gradient_accumulation_steps": 0}, r"gradient_accumulation_steps must be >= 1"),
    ({"eval_accumulation_steps": 0}, r"eval_accumulation_steps must be >= 1"),
    ({"learning_rate": -1e-3}, r"learning_rate must be >= 0"),
    ({"weight_decay": -0.1}, r"weight_decay must be >= 0"),
    ({"warmup_steps": -1}, r"warmup_steps must be >= 0"),
    ({"warmup_ratio": 1.5}, r"warmup_ratio must lie in \[0, 1\]; got warmup_ratio=1.5"),
    ({"warmup_ratio": -0.1}, r"warmup_ratio must lie in \[0, 1\]"),
    ({"adam_beta1": 1.0}, r"adam_beta1 must lie in \[0, 1\)"),
    ({"max_steps": 0}, r"max_steps must be > 0, or -1"),
    ({"num_train_epochs": -1}, r"num_train_epochs must be >= 0"),
    ({"save_total_limit": -1}, r"save_total_limit must be >= 1; use None"),
    ({"label_smoothing_factor": 1.0}, r"label_smoothing_factor must lie in \[0, 1\)"),
    ({"label_smoothing_factor": -0.1}, r"label_smoothing_factor must lie in \[0, 1\)"),
    ({"dataloader_prefetch_factor": 2}, r"dataloader_prefetch_factor needs dataloader_num_workers > 0"),
    ({"torch_empty_cache_steps": 0}, r"torch_empty_cache_steps must be a positive integer"),
    ({"load_best_model_at_end": True, "eval_strategy": "epoch", "save_strategy": "steps"},
     r"load_best_model_at_end needs save_strategy and eval_strategy to match.*'epoch'.*'steps'"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps", "eval_steps": 30,
      "save_steps": 50}, r"save_steps \(50\) to be a round multiple of eval_steps \(30\)"),
    ({"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps", "eval_steps": 0.1,
      "save_steps": 50}, r"mixing a ratio and a step count"),
    ({"logging_steps": 0}, r"logging_strategy='steps' needs logging_steps > 0"),
    ({"torch_compile_mode": "fast"}, r"torch_compile_mode='fast' is not valid"),
    ({"log_level": "loud"}, r"log_level='loud' is not valid"),
    ({"ddp_backend": "tcp"}, r"ddp_backend='tcp' is not valid"),
    ({"half_precision_backend": "fast"}, r"half_precision_backend='fast' is not valid"),
    ({"lr_scheduler_type": "reduce_lr_on_plateau"}, r"lr_scheduler_type='reduce_lr_on_plateau'.*eval_strategy"),
    ({"fp16": True, "use_cpu": True}, r"fp16 mixed precision requires a GPU \(or use bf16 on CPU\)"),
    ({"fsdp": "full_shard", "deepspeed": {"zero_optimization": {}}}, r"fsdp and deepspeed are both set"),
    ({"fsdp": "offload"}, r"fsdp='offload' cannot work alone"),
    ({"fsdp": "full_shard shard_grad_op"}, r"fsdp: 'full_shard' and 'shard_grad_op' exclude"),
    ({"fsdp": "full_shard everything"}, r"fsdp='everything' is not valid"),
    ({"fsdp": "full_shard", "fsdp_min_num_params": 10, "fsdp_config": {"transformer_layer_cls_to_wrap": "B"}},
     r"min_num_params and transformer_layer_cls_to_wrap are exclusive"),
    ({"report_to": "slack"}, r"report_to has unknown integration\(s\) \['slack'\]"),
    ({"report_to": ["none", "wandb"]}, r"report_to=.*mixes 'none'"),
    ({"include_for_metrics": ["logits"]}, r"include_for_metrics has \['logits'\]"),
])
def test_validation_errors_name_the_field(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make(tmp_path, **kwargs)


@CPU_ONLY
def test_fp16_without_a_gpu_is_refused_but_bf16_is_fine(tmp_path):
    with pytest.raises(ValueError, match="fp16 mixed precision requires a GPU"):
        make(tmp_path, fp16=True)
    assert make(tmp_path, bf16=True, use_cpu=True).bf16 is True
    assert make(tmp_path, fp16_full_eval=True).fp16_full_eval is True


@CPU_ONLY
def test_tf32_without_cuda_is_skipped_with_a_warning(tmp_path):
    with pytest.warns(UserWarning, match="tf32=True is ignored"):
        args = TrainingArguments(output_dir=str(tmp_path), tf32=True)
    assert args.tf32 is True
    make(tmp_path, tf32=False)  # no warning when tf32 is turned off


def test_push_to_hub_fields_are_accepted(tmp_path):
    args = make(tmp_path, push_to_hub=True, hub_strategy="checkpoint")  # pushing: tests/trainer/test_push_to_hub.py
    assert args.push_to_hub is True and args.hub_strategy == "checkpoint"
    assert make(tmp_path).set_push_to_hub("me/model").hub_model_id == "me/model"


# ------------------------------------------------------------------ report_to
def test_report_to_is_normalised_to_a_list(tmp_path):
    assert make(tmp_path, report_to="none").report_to == []
    assert make(tmp_path, report_to=None).report_to == []
    assert make(tmp_path, report_to="tensorboard").report_to == ["tensorboard"]
    assert make(tmp_path, report_to=["wandb", "mlflow", "wandb"]).report_to == ["wandb", "mlflow"]
    assert make(tmp_path, report_to="tensorboard,wandb").report_to == ["tensorboard", "wandb"]


def test_report_to_all_lists_installed_integrations(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    fake_installed = {"tensorboard", "mlflow"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name in fake_installed else
                        (None if name in REPORT_TO_INTEGRATIONS.values() else real(name, *a)))
    assert make(tmp_path, report_to="all").report_to == ["mlflow", "tensorboard"]  # upstream's order


# ------------------------------------------------------------------ serialisation
def test_to_dict_json_round_trip(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text("{}")
    args = make(tmp_path, eval_strategy="steps", eval_steps=0.5, save_strategy="steps", save_steps=0.5,
                load_best_model_at_end=True, lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 1},
                report_to=["tensorboard"], debug="underflow_overflow", include_for_metrics=["loss"],
                label_names=["labels"], deepspeed=str(ds), torch_compile_mode="default")
    d = args.to_dict()
    assert d["eval_strategy"] == "steps" and d["lr_scheduler_type"] == "cosine" and d["debug"] == ["underflow_overflow"]
    assert d["optim"] == "adamw_torch_fused" and d["hub_strategy"] == "every_save"
    assert json.loads(args.to_json_string()) == d
    assert make(**d) == args  # to_dict feeds back with no deprecation warning
    fsdp_args = make(tmp_path, fsdp="shard_grad_op auto_wrap", fsdp_config={"fsdp_min_num_params": 5})
    assert make(**json.loads(fsdp_args.to_json_string())) == fsdp_args


def test_secrets_are_masked(tmp_path):
    args = make(tmp_path, hub_token="hf_secret")
    assert args.hub_token == "hf_secret"
    assert args.to_dict()["hub_token"] == "<HUB_TOKEN>"
    assert "hf_secret" not in str(args) and "hf_secret" not in repr(args) and "hf_secret" not in args.to_json_string()


def test_str_lists_sorted_fields(tmp_path):
    text = str(make(tmp_path))
    lines = [ln.split("=")[0] for ln in text.splitlines()[1:-1]]
    assert text.startswith("TrainingArguments(\n") and lines == sorted(lines)
    assert "_runtime_cache" not in text


def test_to_sanitized_dict_has_only_simple_types(tmp_path):
    args = make(tmp_path, use_cpu=True, per_device_train_batch_size=4, report_to="tensorboard")
    d = args.to_sanitized_dict()
    assert d["train_batch_size"] == 4 and d["eval_batch_size"] == 8
    assert d["report_to"] == "['tensorboard']" and d["eval_steps"] == "None" and d["lr_scheduler_kwargs"] == "{}"
    assert all(type(v) in (bool, int, float, str) for v in d.values())


# ------------------------------------------------------------------ runtime properties
def test_runtime_on_cpu_without_launcher(tmp_path, transformers_logging_not_loaded):
    import torch.distributed as dist

    args = make(tmp_path, use_cpu=True, per_device_train_batch_size=4, per_device_eval_batch_size=6)
    assert "_runtime_cache" not in args.__dict__  # nothing resolved at construction
    assert args.device.type == "cpu" and args.n_gpu == 0
    assert (args.world_size, args.process_index, args.local_process_index) == (1, 0, 0)
    assert args.parallel_mode == ParallelMode.NOT_PARALLEL
    assert (args.train_batch_size, args.eval_batch_size) == (4, 6)
    assert args.place_model_on_device is None and args.should_log and args.should_save  # None: the Trainer decides
    assert args.get_process_log_level() == logging.WARNING
    assert make(tmp_path, log_level="info").get_process_log_level() == logging.INFO
    assert not dist.is_initialized()


def test_runtime_is_cached_and_not_serialised(tmp_path):
    args = make(tmp_path, use_cpu=True)
    assert args.device is args.device
    assert "_runtime_cache" in args.__dict__
    assert "_runtime_cache" not in args.to_dict()
    clone = pickle.loads(pickle.dumps(args))
    assert clone == args and "_runtime_cache" not in clone.__dict__
    assert clone.device.type == "cpu"


@pytest.mark.parametrize("rank,local,expect_log,expect_save", [(0, 0, True, True), (2, 0, True, False),
                                                               (3, 1, False, False)])
def test_runtime_under_launcher_env(tmp_path, monkeypatch, rank, local, expect_log, expect_save):
    import torch.distributed as dist

    for key, value in {"RANK": rank, "WORLD_SIZE": 4, "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": 2}.items():
        monkeypatch.setenv(key, str(value))
    groups = []  # the process group is asked for at the first device/n_gpu use (upstream's _setup_devices): stubbed
    monkeypatch.setattr("trainwell.runtime.distributed.init_process_group",
                        lambda env, device, **kw: groups.append((env.world_size, env.rank, device.type)))
    args = make(tmp_path, use_cpu=True, per_device_train_batch_size=4, log_level="info",
                log_level_replica="error")
    assert groups == []  # constructing the arguments touches nothing
    assert args.local_rank == local
    assert (args.world_size, args.process_index, args.local_process_index) == (4, rank, local)
    assert args.parallel_mode == ParallelMode.DISTRIBUTED and args.n_gpu == 0 and args.device.type == "cpu"
    assert args.train_batch_size == 4
    assert args.should_log is expect_log and args.should_save is expect_save
    assert args.get_process_log_level() == (logging.INFO if expect_log else logging.ERROR)
    global_only = make(tmp_path, use_cpu=True, log_on_each_node=False, save_on_each_node=True)
    assert global_only.should_log is (rank == 0) and global_only.should_save is (local == 0)
    assert groups == [(4, rank, "cpu")]  # once (global_only's ranks and logging read the environment only)
    with args.main_process_first(desc="tokenising"):  # no process group (stubbed): must not block
        pass
    assert not dist.is_initialized()


def test_passive_replica_level_is_warning(tmp_path, monkeypatch, transformers_logging_not_loaded):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert make(tmp_path, use_cpu=True, log_level_replica="passive").get_process_log_level() == logging.WARNING


def test_main_process_first_runs_body_in_one_process(tmp_path):
    ran = []
    with make(tmp_path, use_cpu=True).main_process_first(local=False):
        ran.append(1)
    assert ran == [1]


def test_get_warmup_steps(tmp_path):
    assert make(tmp_path, warmup_steps=5, warmup_ratio=0.5).get_warmup_steps(100) == 5
    assert make(tmp_path, warmup_ratio=0.1).get_warmup_steps(95) == 10
    assert make(tmp_path).get_warmup_steps(95) == 0


# ------------------------------------------------------------------ helper setters
def test_helper_setters_chain_and_validate(tmp_path):
    args = make(tmp_path)
    out = (args.set_training(learning_rate=1e-3, batch_size=4, num_epochs=2, gradient_accumulation_steps=2)
           .set_evaluate(strategy="steps", steps=10, batch_size=16)
           .set_save(strategy="epoch", total_limit=2)
           .set_logging(strategy="steps", steps=5, report_to="tensorboard", level="info")
           .set_optimizer(name="sgd", learning_rate=0.1)
           .set_lr_scheduler(name="cosine", num_epochs=2, warmup_ratio=0.1)
           .set_dataloader(train_batch_size=2, num_workers=0, sampler_seed=7)
           .set_testing(batch_size=3))
    assert out is args and args.do_train and args.do_eval and args.do_predict
    assert args.eval_strategy is IntervalStrategy.STEPS and args.eval_steps == 10
    assert args.save_strategy is SaveStrategy.EPOCH and args.save_total_limit == 2
    assert args.report_to == ["tensorboard"] and args.log_level == "info" and args.logging_steps == 5
    assert args.optim is OptimizerNames.SGD and args.learning_rate == 0.1
    assert args.lr_scheduler_type is SchedulerType.COSINE and args.warmup_ratio == 0.1
    assert args.per_device_train_batch_size == 2 and args.per_device_eval_batch_size == 3 and args.data_seed == 7
    assert args.gradient_accumulation_steps == 2 and args.num_train_epochs == 2
    with pytest.raises(ValueError, match="eval_strategy='sometimes'"):
        args.set_evaluate(strategy="sometimes")
    with pytest.raises(ValueError, match="steps > 0"):
        args.set_save(strategy="steps", steps=0)
    with pytest.raises(ValueError, match="optim='adamw_magic'"):
        args.set_optimizer(name="adamw_magic")
    with pytest.raises(ValueError, match="report_to"):
        args.set_logging(report_to="slack")


# ------------------------------------------------------------------ seq2seq
class _GenConfig:
    def to_dict(self):
        return {"max_length": 32, "num_beams": 2}


def test_seq2seq_arguments(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), predict_with_generate=True,
                                        generation_max_length=64, generation_num_beams=4, eval_strategy="epoch")
    assert args.sortish_sampler is False and args.predict_with_generate is True
    assert (args.generation_max_length, args.generation_num_beams) == (64, 4)
    assert args.eval_strategy is IntervalStrategy.EPOCH and args.do_eval
    assert isinstance(args, TrainingArguments) and str(args).startswith("Seq2SeqTrainingArguments(\n")
    assert Seq2SeqTrainingArguments(output_dir=str(tmp_path)).generation_config is None
    with_obj = Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_config=_GenConfig())
    assert with_obj.to_dict()["generation_config"] == {"max_length": 32, "num_beams": 2}
    assert Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_config=tmp_path).generation_config == str(
        tmp_path)
    assert Seq2SeqTrainingArguments(**args.to_dict()) == args
    with pytest.raises(ValueError, match="generation_num_beams=0 must be >= 1"):
        Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_num_beams=0)
    with pytest.raises(ValueError, match="generation_max_length=0"):
        Seq2SeqTrainingArguments(output_dir=str(tmp_path), generation_max_length=0)
    with pytest.raises(ValueError, match="fp16=True and bf16=True"):
        Seq2SeqTrainingArguments(output_dir=str(tmp_path), fp16=True, bf16=True)


@pytest.mark.slow
def test_import_and_construction_do_not_import_torch():
    code = ("import sys; from trainwell.args.fields import TrainingArguments; TrainingArguments(); "
            "from trainwell.args.seq2seq import Seq2SeqTrainingArguments; Seq2SeqTrainingArguments(); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.strip() == "False"
