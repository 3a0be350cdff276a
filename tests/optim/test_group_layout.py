"""Upstream's equal parameter groups run as one torch group (trainwell.optim.group_layout), saved in upstream's layout.

The ground truth is the two-group optimizer upstream builds: after the same steps, the merged optimizer's weights,
``state_dict()`` and schedule state are exactly that optimizer's, and it loads that optimizer's state dicts.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.data import regression_data
from helpers.optim_args import OptimizerArgs
from helpers.models import RegressionModel
from torch import nn

import trainwell
from trainwell.checkpoint.layout import CheckpointError
from trainwell.optim.factory import build_param_groups, create_optimizer
from trainwell.optim.group_layout import (
    GroupLayoutError,
    load_scheduler_state_dict,
    logical_group_sizes,
    logical_param_groups,
    scheduler_state_dict,
)
from trainwell.optim.schedules import get_scheduler


class Mixed(nn.Module):
    """Decay and no-decay parameters interleaved in ``named_parameters`` order (weights, biases, a norm)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 6)
        self.norm = nn.LayerNorm(6)
        self.b = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.norm(self.a(x)))


def _train(optimizer: torch.optim.Optimizer, scheduler: object, model: nn.Module, steps: int = 4) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(3, 4, generator=gen)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def _pair(weight_decay: float = 0.0) -> tuple:
    """(model, optimizer, scheduler) merged when it can be, and the same with upstream's groups, from equal weights."""
    out = []
    for merge in (True, False):
        model = Mixed()
        optimizer = create_optimizer(model, OptimizerArgs(learning_rate=1e-2, weight_decay=weight_decay), merge_equal_groups=merge)
        scheduler = get_scheduler("linear", optimizer, num_warmup_steps=2, num_training_steps=10)
        out.append((model, optimizer, scheduler))
    return out


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        for key, value in state.items():
            assert torch.equal(value, b["state"][index][key]), (index, key)


def test_equal_groups_run_as_one_and_save_upstreams_two():
    (model, optimizer, scheduler), (ref_model, ref_optimizer, ref_scheduler) = _pair()
    assert len(optimizer.param_groups) == 1 and len(ref_optimizer.param_groups) == 2
    sizes = tuple(len(g["params"]) for g in ref_optimizer.param_groups)
    assert logical_group_sizes(optimizer) == sizes and logical_group_sizes(ref_optimizer) is None
    _train(optimizer, scheduler, model)
    _train(ref_optimizer, ref_scheduler, ref_model)
    for name, value in model.state_dict().items():
        assert torch.equal(value, ref_model.state_dict()[name]), name  # the same update, bit for bit
    _assert_same_state(optimizer.state_dict(), ref_optimizer.state_dict())
    assert scheduler_state_dict(scheduler) == ref_scheduler.state_dict()
    assert [len(g["params"]) for g in logical_param_groups(optimizer)] == list(sizes)


def test_weight_decay_keeps_two_groups():
    (_, optimizer, _), _ = _pair(weight_decay=0.1)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    assert logical_group_sizes(optimizer) is None


def test_merged_optimizer_loads_upstreams_two_groups_and_resumes_exactly():
    (model, optimizer, scheduler), (ref_model, ref_optimizer, ref_scheduler) = _pair()
    _train(ref_optimizer, ref_scheduler, ref_model, steps=3)
    model.load_state_dict(ref_model.state_dict())
    # upstream's two groups, folded into one (a copy, as read from optimizer.pt: a live state dict shares its tensors)
    optimizer.load_state_dict(copy.deepcopy(ref_optimizer.state_dict()))
    load_scheduler_state_dict(scheduler, ref_scheduler.state_dict())
    assert len(optimizer.param_groups) == 1 and optimizer.param_groups[0]["lr"] == ref_optimizer.param_groups[0]["lr"]
    _train(optimizer, scheduler, model, steps=3)
    _train(ref_optimizer, ref_scheduler, ref_model, steps=3)
    for name, value in model.state_dict().items():
        assert torch.equal(value, ref_model.state_dict()[name]), name
    _assert_same_state(optimizer.state_dict(), ref_optimizer.state_dict())


def test_groups_that_differ_are_refused_with_the_cause():
    (_, optimizer, scheduler), _ = _pair()
    (_, other, other_scheduler), _ = _pair(weight_decay=0.1)
    with pytest.raises(GroupLayoutError, match="weight_decay"):
        optimizer.load_state_dict(other.state_dict())
    state = dict(other_scheduler.state_dict(), base_lrs=[0.1, 0.2])
    with pytest.raises(GroupLayoutError, match="base_lrs"):
        load_scheduler_state_dict(scheduler, state)


def test_trainer_default_runs_one_group_and_checkpoint_has_two(tmp_path):
    model = RegressionModel()
    args = trainwell.TrainingArguments(output_dir=str(tmp_path), max_steps=2, save_steps=2, logging_steps=1,
                                       per_device_train_batch_size=4, disable_tqdm=True, report_to="none")
    trainer = trainwell.Trainer(model=model, args=args, train_dataset=regression_data(16))
    trainer.train()
    assert len(trainer.optimizer.param_groups) == 1
    assert len(trainer.get_learning_rates()) == 2  # upstream's two groups
    saved = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=True)
    groups = build_param_groups(model, 0.0)
    assert [len(g["params"]) for g in saved["param_groups"]] == [len(g["params"]) for g in groups]
    schedule = torch.load(tmp_path / "checkpoint-2" / "scheduler.pt", weights_only=True)
    assert len(schedule["base_lrs"]) == len(schedule["_last_lr"]) == 2


def test_resume_with_another_weight_decay_names_it_and_loads_nothing(tmp_path):
    def trainer(weight_decay: float, max_steps: int) -> trainwell.Trainer:
        args = trainwell.TrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, save_steps=2,
                                           per_device_train_batch_size=4, disable_tqdm=True, report_to="none",
                                           weight_decay=weight_decay)
        return trainwell.Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16))

    trainer(0.1, 2).train()
    resumed = trainer(0.0, 4)
    before = {k: v.clone() for k, v in resumed.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="weight_decay"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    for name, value in resumed.model.state_dict().items():
        assert torch.equal(value, before[name]), name  # nothing was applied
