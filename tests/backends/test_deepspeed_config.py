"""DeepSpeed config resolution: every "auto" key, mismatch detection, the live ZeRO-3 config (no deepspeed needed)."""

from __future__ import annotations

import gc
import json
from types import SimpleNamespace

import pytest
from torch import nn

from trainwell.args.fields import TrainingArguments
from trainwell.backends.deepspeed.config import (DeepSpeedConfig, infer_hidden_size, is_deepspeed_zero3_enabled,
                                        load_deepspeed_config, remaining_auto_keys, resolve_deepspeed_config,
                                        unset_deepspeed_config)

FULL_AUTO = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "fp16": {"enabled": "auto"},
    "bf16": {"enabled": "auto"},
    "amp": {"enabled": "auto", "opt_level": "auto"},
    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                          "stage3_param_persistence_threshold": "auto"},
}


def make_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=4, gradient_accumulation_steps=3,
                max_grad_norm=0.5, learning_rate=3e-4, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6,
                weight_decay=0.01, warmup_ratio=0.1)
    base.update(kw)
    return TrainingArguments(**base)


class Hidden(nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=hidden)
        self.proj = nn.Linear(3, 5)


def test_every_auto_key_is_filled(tmp_path):
    args = make_args(tmp_path, bf16=True)
    out = resolve_deepspeed_config(FULL_AUTO, args, model=Hidden(16), num_training_steps=95, world_size=2)
    assert out["train_micro_batch_size_per_gpu"] == 4
    assert out["gradient_accumulation_steps"] == 3
    assert out["train_batch_size"] == 4 * 3 * 2
    assert out["gradient_clipping"] == 0.5
    assert out["optimizer"]["params"] == {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.01}
    assert out["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 3e-4, "warmup_num_steps": 10,
                                          "total_num_steps": 95}  # ceil(0.1 * 95)
    assert out["fp16"]["enabled"] is False and out["bf16"]["enabled"] is True
    assert out["amp"] == {"enabled": False, "opt_level": "O1"}
    zero = out["zero_optimization"]
    assert zero["reduce_bucket_size"] == 256
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 256)
    assert zero["stage3_param_persistence_threshold"] == 160
    assert remaining_auto_keys(out) == []
    assert FULL_AUTO["train_batch_size"] == "auto", "the input must not be modified"


def test_warmup_steps_win_over_ratio_and_scheduler_steps_need_the_count(tmp_path):
    args = make_args(tmp_path, warmup_steps=7)
    out = resolve_deepspeed_config(FULL_AUTO, args, num_training_steps=50, world_size=1)
    assert out["scheduler"]["params"]["warmup_num_steps"] == 7
    early = resolve_deepspeed_config(FULL_AUTO, args, world_size=1)
    assert early["scheduler"]["params"]["total_num_steps"] == "auto"
    assert "scheduler.params.total_num_steps" in remaining_auto_keys(early)


def test_fp16_amp_and_apex(tmp_path, monkeypatch):
    args = make_args(tmp_path)
    args.fp16 = True  # set after construction: fp16 on CPU is refused by validation, the config logic is what we test
    out = resolve_deepspeed_config(FULL_AUTO, args, world_size=1)
    assert out["fp16"]["enabled"] is True and out["amp"]["enabled"] is False and out["bf16"]["enabled"] is False
    args.half_precision_backend = "apex"
    args.fp16_opt_level = "O2"
    out = resolve_deepspeed_config(FULL_AUTO, args, world_size=1)
    assert out["fp16"]["enabled"] is False and out["amp"] == {"enabled": True, "opt_level": "O2"}


def test_missing_top_level_keys_are_added_and_sections_are_not(tmp_path):
    out = resolve_deepspeed_config({"zero_optimization": {"stage": 2}}, make_args(tmp_path, bf16=True), world_size=2)
    assert (out["train_micro_batch_size_per_gpu"], out["gradient_accumulation_steps"], out["train_batch_size"],
            out["gradient_clipping"]) == (4, 3, 24, 0.5)
    assert "optimizer" not in out and "scheduler" not in out  # the trainer's own optimizer/scheduler are used
    assert out["bf16"] == {"enabled": True}  # asked for by the arguments


def test_mismatches_are_all_listed_in_one_error(tmp_path):
    config = {
        "train_batch_size": 100, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.1, "betas": [0.8, 0.95], "eps": 1e-6,
                                                  "weight_decay": 0.01}},
        "bf16": {"enabled": True},
    }
    with pytest.raises(ValueError) as info:
        resolve_deepspeed_config(config, make_args(tmp_path), world_size=2)
    message = str(info.value)
    assert "4 place(s)" in message
    assert "train_batch_size: config value 100 != TrainingArguments.per_device_train_batch_size x " \
           "gradient_accumulation_steps x world_size (2) value 24" in message
    assert "gradient_accumulation_steps: config value 2 != TrainingArguments.gradient_accumulation_steps value 3" \
        in message
    assert "optimizer.params.lr: config value 0.1 != TrainingArguments.learning_rate value 0.0003" in message
    assert "bf16.enabled: config value True != TrainingArguments.bf16 (or bf16_full_eval) value False" in message
    assert '"auto"' in message


def test_matching_explicit_values_pass(tmp_path):
    config = {"train_batch_size": 12, "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
              "optimizer": {"params": {"lr": 3e-4, "betas": (0.8, 0.95), "eps": 1e-6}},
              "scheduler": {"params": {"warmup_num_steps": 2, "total_num_steps": 20, "warmup_max_lr": 3e-4}},
              "fp16": {"enabled": "false"}}
    out = resolve_deepspeed_config(config, make_args(tmp_path), num_training_steps=20, world_size=1)
    assert out["train_micro_batch_size_per_gpu"] == 4


def test_hidden_size_sources():
    assert infer_hidden_size(Hidden(32)) == 32
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2))
    assert infer_hidden_size(model) == 64
    conv = nn.Conv1d(2, 2, 1)
    conv.config = {"hidden_sizes": [8, 24, 16]}
    assert infer_hidden_size(conv) == 24
    assert infer_hidden_size(nn.Conv1d(2, 2, 1)) is None


def test_hidden_size_auto_without_a_size_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match="reduce_bucket_size"):
        resolve_deepspeed_config(FULL_AUTO, make_args(tmp_path), model=nn.Conv1d(2, 2, 1), world_size=1)


def test_load_from_file_and_json_string(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert load_deepspeed_config(str(path)) == {"zero_optimization": {"stage": 2}}
    assert load_deepspeed_config('{"a": 1}') == {"a": 1}
    with pytest.raises(ValueError, match="no such file"):
        load_deepspeed_config(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValueError, match="bad.json"):
        load_deepspeed_config(str(bad))


@pytest.mark.slow  # over a second
def test_live_config_is_weak_and_answers_zero3():
    unset_deepspeed_config()
    assert not is_deepspeed_zero3_enabled()
    config = DeepSpeedConfig({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    assert is_deepspeed_zero3_enabled()
    assert config.is_offload() and config.zero_stage == 3 and config.dtype_name() == "float32"
    del config
    gc.collect()
    assert not is_deepspeed_zero3_enabled()
    two = DeepSpeedConfig({"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    assert not is_deepspeed_zero3_enabled() and not two.is_offload() and two.dtype_name() == "bfloat16"
    with pytest.raises(ValueError, match="stage"):
        DeepSpeedConfig({"zero_optimization": {"stage": 4}})
    unset_deepspeed_config()


def test_memory_table_matches_the_guide_and_deepspeed(capsys):
    from trainwell.backends.deepspeed import estimate_zero_memory
    from trainwell.cli.commands.deepspeed_tools import cmd_estimate_memory

    ours = estimate_zero_memory(2_783_000_000, 1, 1, largest_layer_params=65_000_000, use_deepspeed=False)
    gib = 2 ** 30
    z3 = [(round(r.cpu_bytes / gib, 1), round(r.gpu_bytes / gib, 1)) for r in ours if r.stage == 3]
    # the guide's T0_3B table (1 GPU): 70.00/0.25, 62.23/5.43, 0.37/46.91, 15.56/46.91 GB
    assert z3 == [(70.0, 0.2), (70.0, 0.2), (62.2, 5.4), (62.2, 5.4), (0.4, 46.9), (15.6, 46.9)]
    two = estimate_zero_memory(2_783_000_000, 2, 1, largest_layer_params=65_000_000, use_deepspeed=False)
    assert round(two[2].gpu_bytes / gib, 2) == 2.83 and round(two[5].cpu_bytes / gib, 1) == 31.1
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        pass
    else:
        assert estimate_zero_memory(2_783_000_000, 2, 1, largest_layer_params=65_000_000) == two
    assert cmd_estimate_memory(["--params", "2.783e9", "--gpus", "1", "--largest-layer-params", "65e6"]) == 0
    printed = capsys.readouterr().out
    assert "offload_param=cpu , offload_optimizer=cpu , zero_init=1" in printed and "46.90GB" in printed
    with pytest.raises(ValueError, match="gpus"):
        estimate_zero_memory(10, 0, 1)


def test_zero_to_fp32_rejects_a_folder_without_a_zero_checkpoint(tmp_path):
    from trainwell.backends.deepspeed import zero_to_fp32

    with pytest.raises(FileNotFoundError, match="latest"):
        zero_to_fp32(tmp_path, tmp_path / "out.safetensors")
