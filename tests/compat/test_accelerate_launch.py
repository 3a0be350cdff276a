"""`accelerate launch --config_file cfg.yaml train.py`: the run trains with the precision and sharding of the config.

The launch environments are produced by accelerate's own code (``accelerate.commands.launch`` parses the config
file, ``accelerate.utils.launch`` builds the variables for each launcher), so the names and values are the real
ones; one real ``accelerate launch`` (2 processes, FSDP full_shard + bf16 on the CPU) trains end to end.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainwell import Trainer, TrainingArguments
from helpers.launch import child_env, free_port, run_json
from trainwell.runtime.accelerate_env import accelerate_settings, apply_accelerate_env

pytest.importorskip("accelerate")

HERE = Path(__file__).resolve().parent
JOB = HERE / "accelerate_job.py"

FSDP2_BF16 = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: bf16
num_machines: 1
num_processes: 2
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_cpu_ram_efficient_loading: true
  fsdp_activation_checkpointing: false
"""

FSDP1_GRAD_OP_FP16 = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
mixed_precision: fp16
num_machines: 1
num_processes: 2
fsdp_config:
  fsdp_version: 1
  fsdp_sharding_strategy: SHARD_GRAD_OP
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 1000
  fsdp_offload_params: true
  fsdp_backward_prefetch: BACKWARD_PRE
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_activation_checkpointing: true
"""

FSDP2_NO_RESHARD = FSDP2_BF16.replace("fsdp_reshard_after_forward: true", "fsdp_reshard_after_forward: false")

DEEPSPEED_PLUGIN = """\
compute_environment: LOCAL_MACHINE
distributed_type: DEEPSPEED
mixed_precision: bf16
num_machines: 1
num_processes: 2
deepspeed_config:
  gradient_accumulation_steps: 2
  gradient_clipping: 0.5
  offload_optimizer_device: cpu
  offload_param_device: none
  zero3_init_flag: false
  zero3_save_16bit_model: true
  zero_stage: 3
"""

MULTI_GPU_FP16_DYNAMO = """\
compute_environment: LOCAL_MACHINE
distributed_type: MULTI_GPU
mixed_precision: fp16
num_machines: 1
num_processes: 2
dynamo_config:
  dynamo_backend: INDUCTOR
  dynamo_mode: max-autotune
"""


def accelerate_env(tmp_path: Path, config: str, *flags: str) -> dict[str, str]:
    """The variables ``accelerate launch --config_file <config> *flags script.py`` sets (accelerate's own code)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import (prepare_deepspeed_cmd_env, prepare_multi_gpu_env,
                                         prepare_simple_launcher_cmd_env)

    cfg = tmp_path / "accelerate_config.yaml"
    cfg.write_text(config)
    argv = ["--config_file", str(cfg), "--main_process_port", str(free_port()), *flags, "script.py"]
    args, defaults, mp_from_config = _validate_launch_command(launch_command_parser().parse_args(argv))
    if args.use_deepspeed and not args.cpu:
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        args.deepspeed_fields_from_accelerate_config = ",".join(fields + (["mixed_precision"] if mp_from_config
                                                                          else []))
        _, env = prepare_deepspeed_cmd_env(args)
    elif (args.use_fsdp or args.multi_gpu) and not args.cpu:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return {k: v for k, v in env.items() if os.environ.get(k) != v}


def make_args(tmp_path: Path, **kwargs: Any) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, **kwargs)


def fsdp_words(args: TrainingArguments) -> set[str]:
    return {getattr(o, "value", o) for o in args.fsdp}


# ------------------------------------------------------------------------------------------------- the mapping


def test_fsdp2_full_shard_bf16(tmp_path: Path) -> None:
    env = accelerate_env(tmp_path, FSDP2_BF16)
    args = make_args(tmp_path)
    changed = apply_accelerate_env(args, env)
    assert args.bf16 and not args.fp16
    assert fsdp_words(args) == {"full_shard", "auto_wrap"}
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["Block"]
    assert args.fsdp_config["cpu_ram_efficient_loading"] is True
    assert args.fsdp_config["version"] == 2
    assert set(changed) == {"bf16", "fsdp", "fsdp_config"}


def test_fsdp2_without_reshard_after_forward_is_shard_grad_op(tmp_path: Path) -> None:
    args = make_args(tmp_path)
    apply_accelerate_env(args, accelerate_env(tmp_path, FSDP2_NO_RESHARD))
    assert fsdp_words(args) == {"shard_grad_op", "auto_wrap"}


def test_fsdp1_shard_grad_op_offload_size_wrap(tmp_path: Path) -> None:
    env = accelerate_env(tmp_path, FSDP1_GRAD_OP_FP16)
    assert accelerate_settings(env)["fp16"][0] is True  # FSDP + fp16: a ShardedGradScaler, as --fsdp ... --fp16
    args = make_args(tmp_path)
    env["ACCELERATE_MIXED_PRECISION"] = "no"
    apply_accelerate_env(args, env)
    assert fsdp_words(args) == {"shard_grad_op", "offload", "auto_wrap"}
    assert args.fsdp_config["min_num_params"] == 1000
    assert "transformer_layer_cls_to_wrap" not in args.fsdp_config
    assert args.fsdp_config["activation_checkpointing"] is True
    assert args.fsdp_config["backward_prefetch"] == "BACKWARD_PRE"


def test_deepspeed_plugin_variables_become_a_config(tmp_path: Path) -> None:
    env = accelerate_env(tmp_path, DEEPSPEED_PLUGIN)
    args = make_args(tmp_path)
    apply_accelerate_env(args, env)
    assert args.bf16 and args.gradient_accumulation_steps == 2 and args.max_grad_norm == 0.5
    zero = args.deepspeed["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"] == {"device": "cpu"} and "offload_param" not in zero
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert args.deepspeed["gradient_accumulation_steps"] == "auto"  # filled from the arguments just set


def test_deepspeed_config_file(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    config = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 2\n" \
             f"deepspeed_config:\n  deepspeed_config_file: {ds}\n  zero3_init_flag: false\n"
    env = accelerate_env(tmp_path, config)
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(ds)
    args = make_args(tmp_path)
    apply_accelerate_env(args, env)
    assert args.deepspeed == str(ds)
    same = make_args(tmp_path, deepspeed=str(ds))
    apply_accelerate_env(same, env)  # the same file in both places is no conflict
    assert same.deepspeed == str(ds)


def test_multi_gpu_bf16_with_dynamo(tmp_path: Path) -> None:
    args = make_args(tmp_path)
    apply_accelerate_env(args, accelerate_env(tmp_path, MULTI_GPU_FP16_DYNAMO.replace("fp16", "bf16")))
    assert args.bf16 and not args.fsdp and args.deepspeed is None
    assert args.torch_compile and args.torch_compile_backend == "inductor"
    assert args.torch_compile_mode == "max-autotune"


def test_cpu_flag(tmp_path: Path) -> None:
    env = accelerate_env(tmp_path, MULTI_GPU_FP16_DYNAMO.replace("fp16", "'no'"), "--cpu")
    assert env["ACCELERATE_USE_CPU"] == "True"
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none")
    args.device  # resolved before the Trainer exists: resolved again after the launch settings
    apply_accelerate_env(args, env)
    assert args.use_cpu and args.device.type == "cpu" and args.dataloader_pin_memory is False


def test_plain_run_and_default_launch_change_nothing(tmp_path: Path) -> None:
    args = make_args(tmp_path, bf16=True, gradient_accumulation_steps=3)
    assert apply_accelerate_env(args, {}) == {}
    env = accelerate_env(tmp_path, MULTI_GPU_FP16_DYNAMO.replace("mixed_precision: fp16", "mixed_precision: 'no'")
                         .replace("INDUCTOR", "'NO'"))
    assert env["ACCELERATE_MIXED_PRECISION"] == "no"
    assert apply_accelerate_env(args, env) == {}
    assert args.bf16 and args.gradient_accumulation_steps == 3  # the user's values stand


def test_variables_left_by_an_in_process_accelerator_are_ignored(tmp_path: Path) -> None:
    """An ``Accelerator`` with a DeepSpeed/FSDP plugin sets ACCELERATE_USE_* in os.environ for good; without
    ``accelerate launch`` (ACCELERATE_MIXED_PRECISION) that must not turn a later Trainer into a DeepSpeed run."""
    args = make_args(tmp_path)
    assert apply_accelerate_env(args, {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_FSDP": "True",
                                       "FSDP_CPU_RAM_EFFICIENT_LOADING": "True"}) == {}
    assert args.deepspeed is None and not args.fsdp


def test_applying_twice_is_harmless(tmp_path: Path) -> None:
    env = accelerate_env(tmp_path, DEEPSPEED_PLUGIN)
    args = make_args(tmp_path)
    apply_accelerate_env(args, env)
    assert apply_accelerate_env(args, env) == {}


def test_user_values_equal_to_the_launch_are_fine(tmp_path: Path) -> None:
    env = accelerate_env(tmp_path, FSDP2_BF16)
    args = make_args(tmp_path, bf16=True, fsdp="full_shard auto_wrap",
                     fsdp_config={"transformer_layer_cls_to_wrap": ["Block"]})
    apply_accelerate_env(args, env)
    assert fsdp_words(args) == {"full_shard", "auto_wrap"}


# -------------------------------------------------------------------------------------------------- conflicts


@pytest.mark.parametrize("config, kwargs, names", [
    (MULTI_GPU_FP16_DYNAMO, dict(bf16=True), ["bf16=True", "ACCELERATE_MIXED_PRECISION=fp16"]),
    (FSDP2_BF16, dict(fsdp="shard_grad_op"), ["fsdp", "full_shard"]),
    (FSDP2_BF16, dict(fsdp="full_shard auto_wrap", fsdp_config={"transformer_layer_cls_to_wrap": ["Other"]}),
     ["transformer_layer_cls_to_wrap", "Other", "Block"]),
    (FSDP1_GRAD_OP_FP16.replace("fp16", "bf16"), dict(fsdp_config={"transformer_layer_cls_to_wrap": ["Block"]}),
     ["min_num_params"]),
    (DEEPSPEED_PLUGIN, dict(gradient_accumulation_steps=4), ["gradient_accumulation_steps=4",
                                                             "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2"]),
    (DEEPSPEED_PLUGIN, dict(max_grad_norm=2.0), ["max_grad_norm", "ACCELERATE_GRADIENT_CLIPPING"]),
    (DEEPSPEED_PLUGIN, dict(fsdp="full_shard"), ["fsdp", "DeepSpeed"]),
    (MULTI_GPU_FP16_DYNAMO, dict(torch_compile_backend="eager"), ["torch_compile_backend", "inductor"]),
])
def test_conflicts_name_both_sides(tmp_path: Path, config: str, kwargs: dict[str, Any], names: list[str]) -> None:
    env = accelerate_env(tmp_path, config)
    args = make_args(tmp_path, **kwargs)
    with pytest.raises(ValueError, match="conflicts with the TrainingArguments") as info:
        apply_accelerate_env(args, env)
    for name in names:
        assert name in str(info.value)


def test_two_deepspeed_configs_are_an_error(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text("{}")
    env = accelerate_env(tmp_path, DEEPSPEED_PLUGIN)
    with pytest.raises(ValueError, match="two DeepSpeed configurations"):
        apply_accelerate_env(make_args(tmp_path, deepspeed=str(other)), env)


def test_fsdp_launch_with_deepspeed_arguments_is_an_error(tmp_path: Path) -> None:
    ds = tmp_path / "ds.json"
    ds.write_text("{}")
    with pytest.raises(ValueError, match="deepspeed is set but the launch asks for FSDP"):
        apply_accelerate_env(make_args(tmp_path, deepspeed=str(ds)), accelerate_env(tmp_path, FSDP2_BF16))


@pytest.mark.parametrize("env, match", [
    ({"ACCELERATE_MIXED_PRECISION": "fp8"}, "ACCELERATE_MIXED_PRECISION='fp8'"),
    ({"ACCELERATE_USE_MEGATRON_LM": "true"}, "Megatron-LM"),
    ({"ACCELERATE_USE_PARALLELISM_CONFIG": "true", "PARALLELISM_CONFIG_TP_SIZE": "2"}, "PARALLELISM_CONFIG_TP_SIZE=2"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD": "true"},
     "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_IGNORED_MODULES": "head"}, "FSDP_IGNORED_MODULES"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "EVERYTHING"}, "FSDP_SHARDING_STRATEGY"),
    ({"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR", "ACCELERATE_DYNAMO_USE_FULLGRAPH": "True"}, "fullgraph"),
    ({"ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_DEEPSPEED": "true"}, "two sharding backends"),
    ({"ACCELERATE_USE_FSDP": "maybe"}, "ACCELERATE_USE_FSDP='maybe' is not a boolean"),
    ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "two"}, "is not an integer"),
])
def test_what_trainwell_cannot_honour_is_an_error(env: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        accelerate_settings(env)


# ------------------------------------------------------------------------------------- the Trainer reads it


def test_trainer_trains_in_the_launch_precision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    model = torch.nn.Linear(2, 1)
    trainer = Trainer(model=model, args=make_args(tmp_path))
    assert trainer.args.bf16
    assert trainer.backend.autocast() is not None and trainer.compute_loss_context_manager().fast_dtype \
        == torch.bfloat16


def test_trainer_refuses_a_conflicting_launch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(ValueError, match=r"bf16=True.*ACCELERATE_MIXED_PRECISION=fp16"):
        Trainer(model=torch.nn.Linear(2, 1), args=make_args(tmp_path, bf16=True))


def test_fp16_launch_on_the_cpu_is_an_error_naming_the_launch(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """fp16 needs a GPU: the launch's fp16 fails like TrainingArguments(fp16=True) does, naming the variable."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(ValueError, match=r"ACCELERATE_MIXED_PRECISION=fp16.*fp16 mixed precision requires a GPU"):
        Trainer(model=torch.nn.Linear(2, 1), args=make_args(tmp_path))


# ---------------------------------------------------------------------------------------- a real launch


DEEPSPEED_ZERO2_FP32 = DEEPSPEED_PLUGIN.replace("mixed_precision: bf16", "mixed_precision: 'no'").replace(
    "zero_stage: 3", "zero_stage: 2").replace("offload_optimizer_device: cpu", "offload_optimizer_device: none")


def _launch(tmp_path: Path, config: str) -> dict[str, Any]:
    """``accelerate launch --config_file cfg.yaml --num_processes 2 accelerate_job.py ...``; rank 0's result."""
    cfg = tmp_path / "accelerate_config.yaml"
    cfg.write_text(config)
    env = child_env(drop=[k for k in os.environ if k.startswith(("ACCELERATE_", "FSDP_"))])
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(cfg), "--num_processes", "2",
               "--main_process_port", str(free_port()), str(JOB), str(tmp_path), "--output_dir", str(tmp_path / "out"),
               "--per_device_train_batch_size", "4", "--num_train_epochs", "1", "--logging_steps", "1",
               "--report_to", "none", "--save_strategy", "no", "--disable_tqdm", "true"]
    return run_json(command, tmp_path / "result.json", "accelerate launch", timeout=480, env=env)


@pytest.mark.slow
@pytest.mark.distributed
def test_real_accelerate_launch_fsdp_full_shard_bf16(tmp_path: Path) -> None:
    """``distributed_type: FSDP`` (v2, full shard, transformer wrap) + ``mixed_precision: bf16``, 2 processes."""
    result = _launch(tmp_path, FSDP2_BF16)
    assert result["env"]["ACCELERATE_USE_FSDP"] == "true" and result["env"]["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert result["world_size"] == 2 and result["bf16"] is True
    assert result["fsdp"] == ["auto_wrap", "full_shard"]
    assert result["backend"] == "FSDPBackend"
    assert result["param_types"] == ["DTensor"]  # the parameters are sharded
    assert result["mp_param_dtype"] == "torch.bfloat16" and result["compute_dtype"] == "torch.bfloat16"
    assert result["global_step"] == 4 and len(result["losses"]) == 4
    assert all(0 < loss < 10 for loss in result["losses"])


@pytest.mark.slow
@pytest.mark.distributed
def test_real_accelerate_launch_deepspeed_plugin(tmp_path: Path) -> None:
    """``distributed_type: DEEPSPEED`` with plugin fields (ZeRO-2, accumulation 2, clipping 0.5), 2 processes."""
    result = _launch(tmp_path, DEEPSPEED_ZERO2_FP32)
    assert result["env"]["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert result["backend"] == "DeepSpeedBackend" and result["world_size"] == 2
    assert result["ds_engine"] == {"zero_stage": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
                                   "bf16": False}
    assert result["gradient_accumulation_steps"] == 2 and result["max_grad_norm"] == 0.5
    assert result["global_step"] == 2 and len(result["losses"]) == 2  # 32 samples / (4 x 2 ranks x 2 steps)
