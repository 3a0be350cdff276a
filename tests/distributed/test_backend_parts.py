"""Pieces of the DDP/FSDP backends that need no process group: option parsing, unit selection, optimizer swap."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainwell.backends.ddp import follow_optimizer, wants_zero
from trainwell.backends.fsdp import FSDPBackend, check_fsdp_config, fsdp_options, units_to_wrap
from trainwell.backends.registry import _fsdp_shards
from trainwell.runtime.precision import Precision
from trainwell.optim.schedules import get_scheduler


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)


class Net(nn.Module):
    _no_split_modules = ["Layer"]

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 4)  # 12 parameters
        self.layers = nn.ModuleList([Layer(4), Layer(4)])  # 20 parameters each
        self.head = nn.Linear(4, 1)  # 5 parameters


def test_fsdp_words_and_no_shard() -> None:
    assert fsdp_options(SimpleNamespace(fsdp="full_shard auto_wrap")) == {"full_shard", "auto_wrap"}
    assert _fsdp_shards(SimpleNamespace(fsdp="full_shard"))
    assert not _fsdp_shards(SimpleNamespace(fsdp="no_shard"))  # replicated: runs as DDP
    assert not _fsdp_shards(SimpleNamespace(fsdp=[]))


def test_sharded_ddp_simple_means_zero() -> None:
    assert wants_zero(SimpleNamespace(sharded_ddp="simple"))
    assert not wants_zero(SimpleNamespace(sharded_ddp=[]))


def test_units_by_class_default_no_split_modules() -> None:
    net = Net()
    assert units_to_wrap(net, {"full_shard", "auto_wrap"}, {}) == list(net.layers)
    assert units_to_wrap(net, {"full_shard"}, {}) == []  # no auto_wrap: the root is the only unit


def test_units_by_class_name_not_found_names_the_fix() -> None:
    with pytest.raises(ValueError, match="transformer_layer_cls_to_wrap"):
        units_to_wrap(Net(), {"auto_wrap"}, {"transformer_layer_cls_to_wrap": ["DecoderLayer"]})


def test_units_by_size_children_first() -> None:
    net = Net()
    net._no_split_modules = None
    chosen = units_to_wrap(net, {"auto_wrap"}, {"min_num_params": 12})
    # the layers' linears (20 each) and the embedding (12); the ModuleList's parameters are already covered
    assert chosen == [net.embed, net.layers[0].linear, net.layers[1].linear]


def test_fsdp_fp16_uses_autocast_and_a_sharded_scaler() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    args = SimpleNamespace(fsdp="full_shard", fsdp_config={}, fp16=True, bf16=False, gradient_checkpointing=False)
    backend = FSDPBackend(args, torch.device("cpu"), Precision(torch.device("cpu"), dtype=torch.float16))
    assert isinstance(backend.scaler, ShardedGradScaler) and backend.scaler.is_enabled()
    assert backend.mp_policy is None and not backend.caps.owns_precision  # fp32 shards, fp16 autocast


@pytest.mark.parametrize("config", [
    {"backward_prefetch": "BACKWARD_PRE", "use_orig_params": True, "state_dict_type": "FULL_STATE_DICT"},
    {"backward_prefetch": "backward_pre", "use_orig_params": "true", "state_dict_type": "SHARDED_STATE_DICT"},
    {"backward_prefetch": 1}, {},
])
def test_fsdp_config_keys_fsdp2_does_by_design_are_accepted(config) -> None:
    check_fsdp_config(config)


@pytest.mark.parametrize("config,reason", [
    ({"backward_prefetch": "BACKWARD_POST"}, r"backward_prefetch='BACKWARD_POST': FSDP2 always prefetches.*"
                                             r"set fsdp_backward_prefetch: BACKWARD_PRE"),
    ({"backward_prefetch": "NO_PREFETCH"}, r"backward_prefetch='NO_PREFETCH'"),
    ({"use_orig_params": False}, r"use_orig_params=false: .*set fsdp_use_orig_params: true"),
    ({"state_dict_type": "LOCAL_STATE_DICT"}, r"state_dict_type='LOCAL_STATE_DICT': .*SHARDED_STATE_DICT"),
])
def test_fsdp_config_keys_fsdp2_cannot_honour_are_refused_with_the_fix(config, reason) -> None:
    with pytest.raises(ValueError, match=reason):
        check_fsdp_config(config)
    args = SimpleNamespace(fsdp="full_shard", fsdp_config=config, fp16=False, bf16=False, gradient_checkpointing=False)
    with pytest.raises(ValueError, match=reason):  # the backend refuses it before any model is touched
        FSDPBackend(args, torch.device("cpu"), Precision(torch.device("cpu")))


def test_accelerate_fsdp_fp16_gets_the_sharded_scaler_of_fsdp_fp16(tmp_path) -> None:
    """``accelerate launch`` FSDP + fp16 resolves to the arguments of ``--fsdp ... --fp16`` (tested to train like
    DDP fp16 in tests/compat/test_defaults_compat.py), no longer refused."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from trainwell.runtime.accelerate_env import accelerate_settings

    env = {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_MIXED_PRECISION": "fp16", "FSDP_SHARDING_STRATEGY": "FULL_SHARD",
           "FSDP_SYNC_MODULE_STATES": "true", "FSDP_USE_ORIG_PARAMS": "true", "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE",
           "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}
    settings = accelerate_settings(env)
    assert settings["fp16"][0] is True and settings["fsdp"][0] == ["full_shard"]
    config = settings["fsdp_config"][0]
    assert config["sync_module_states"] is True and config["use_orig_params"] is True
    args = SimpleNamespace(fsdp="full_shard", fsdp_config=config, fp16=True, bf16=False, gradient_checkpointing=False)
    backend = FSDPBackend(args, torch.device("cpu"), Precision(torch.device("cpu"), dtype=torch.float16))
    assert isinstance(backend.scaler, ShardedGradScaler) and backend.scaler.is_enabled()


def test_fsdp_refuses_double_checkpointing() -> None:
    args = SimpleNamespace(fsdp="full_shard", fsdp_config={"activation_checkpointing": True}, fp16=False,
                           bf16=True, gradient_checkpointing=True)
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        FSDPBackend(args, torch.device("cpu"), Precision(torch.device("cpu")))


def test_fsdp_bf16_policy_owns_precision() -> None:
    args = SimpleNamespace(fsdp="full_shard", fsdp_config={}, fp16=False, bf16=True, gradient_checkpointing=False)
    backend = FSDPBackend(args, torch.device("cpu"), Precision(torch.device("cpu"), dtype=torch.bfloat16))
    assert backend.caps.owns_precision and backend.caps.sharded_state
    assert backend.mp_policy.param_dtype == torch.bfloat16
    with backend.autocast():  # upstream: autocast on top of the bf16 policy (accelerate's native_amp forward)
        assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


def test_scheduler_follows_a_replaced_optimizer() -> None:
    params = [nn.Parameter(torch.ones(2))]
    first = torch.optim.SGD(params, lr=1.0)
    scheduler = get_scheduler("linear", optimizer=first, num_warmup_steps=0, num_training_steps=4)
    second = torch.optim.SGD([{**g} for g in first.param_groups], lr=1.0)
    follow_optimizer(scheduler, second)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "optimizer.step() overridden" / call-order warning
        for _ in range(2):
            params[0].grad = torch.ones(2)
            second.step()
            scheduler.step()
    assert second.param_groups[0]["lr"] == pytest.approx(0.5)
    assert first.param_groups[0]["lr"] == pytest.approx(1.0)  # the old optimizer is no longer driven
