"""The optimizer users see is upstream's: two parameter groups ``[decay, no_decay]`` in upstream's order, an empty one
kept, in ``optimizer.param_groups``, ``get_optimizer_group()`` and ``optimizer.pt``; ``get_optimizer_cls_and_kwargs``
is the public hook ``create_optimizer`` calls (a subclass's override is used).

The first three tests are upstream's own (``TrainerOptimizerTest::test_get_optimizer_group``,
``TrainerOptimizerTest::test_no_wd_param_group``, ``TrainerLRTest::test_get_learning_rates``), restated here.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from helpers.data import regression_data
from torch import nn
from torch.nn import functional as F

import trainwell
from trainwell.checkpoint.layout import COMPLETE_MARKER, CheckpointError


def _args(tmp_path: Any, **kwargs: Any) -> trainwell.TrainingArguments:
    base = dict(output_dir=str(tmp_path), report_to="none", disable_tqdm=True)
    return trainwell.TrainingArguments(**{**base, **kwargs})


class Block(nn.Module):
    """Two linear layers, two LayerNorms and a free bias, as upstream's test layer: only the 2 linear weights decay."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear1 = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.linear2 = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.bias = nn.Parameter(torch.zeros(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln2(self.linear2(self.ln1(self.linear1(x)))) + self.bias


class LoraLike(nn.Module):
    """A frozen base with two trainable low-rank adapters (weights only): every trainable tensor decays."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.base = nn.Linear(2, 4)
        self.lora_a = nn.Linear(2, 2, bias=False)
        self.lora_b = nn.Linear(2, 4, bias=False)
        self.head = nn.Linear(4, 1)
        for module in (self.base, self.head):
            module.requires_grad_(False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        pred = self.head(torch.tanh(self.base(x) + self.lora_b(self.lora_a(x)))).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels), "logits": pred}


def _sizes(groups: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[int]:
    return [len(group["params"]) for group in groups]


# ------------------------------------------------------------------------------------------ upstream's own tests
def test_upstream_get_optimizer_group(tmp_path):
    model = nn.Sequential(nn.Linear(128, 64))
    trainer = trainwell.Trainer(model=model, args=_args(tmp_path))
    with pytest.raises(ValueError):
        trainer.get_optimizer_group()
    trainer.create_optimizer()
    assert len(trainer.get_optimizer_group()) == 2
    param = next(model.parameters())
    group = trainer.get_optimizer_group(param)
    assert param in group["params"]
    assert group is trainer.optimizer.param_groups[0] and group["weight_decay"] == 0.0


def test_upstream_no_wd_param_group(tmp_path):
    model = nn.Sequential(Block(128), nn.ModuleList([Block(128), Block(128)]))
    trainer = trainwell.Trainer(model=model, args=_args(tmp_path))
    trainer.create_optimizer_and_scheduler(10)
    wd_names = ["0.linear1.weight", "0.linear2.weight", "1.0.linear1.weight", "1.0.linear2.weight",
                "1.1.linear1.weight", "1.1.linear2.weight"]
    wd_params = [p for n, p in model.named_parameters() if n in wd_names]
    no_wd_params = [p for n, p in model.named_parameters() if n not in wd_names]
    assert trainer.optimizer.param_groups[0]["params"] == wd_params
    assert trainer.optimizer.param_groups[1]["params"] == no_wd_params
    assert _sizes(trainer.optimizer.param_groups) == [6, 21]


def test_upstream_get_learning_rates(tmp_path):
    trainer = trainwell.Trainer(model=nn.Sequential(nn.Linear(128, 64)), args=_args(tmp_path))
    with pytest.raises(ValueError):
        trainer.get_learning_rates()
    trainer.create_optimizer()
    assert trainer.get_learning_rates() == [5e-05, 5e-05]


# ------------------------------------------------------------------------------------------ empty groups are kept
def test_lora_like_model_has_two_groups_the_second_empty(tmp_path):
    model = LoraLike()
    args = _args(tmp_path, max_steps=2, save_steps=2, per_device_train_batch_size=4, weight_decay=0.1)
    trainer = trainwell.Trainer(model=model, args=args, train_dataset=regression_data(16))
    trainer.train()
    groups = trainer.optimizer.param_groups
    assert _sizes(groups) == [2, 0]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    assert groups[0]["params"] == [model.lora_a.weight, model.lora_b.weight]
    assert trainer.get_optimizer_group() == [[model.lora_a.weight, model.lora_b.weight], []]
    assert trainer.get_optimizer_group(model.lora_b.weight) is groups[0]
    saved = torch.load(tmp_path / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert [g["params"] for g in saved["param_groups"]] == [[0, 1], []]
    assert sorted(saved["state"]) == [0, 1]
    schedule = torch.load(tmp_path / "checkpoint-2" / "scheduler.pt", weights_only=True)
    assert len(schedule["base_lrs"]) == len(schedule["_last_lr"]) == 2


def test_a_model_of_only_no_decay_parameters_has_an_empty_first_group(tmp_path):
    trainer = trainwell.Trainer(model=nn.LayerNorm(3), args=_args(tmp_path, weight_decay=0.1))
    trainer.create_optimizer()
    assert _sizes(trainer.optimizer.param_groups) == [0, 2]
    assert [g["weight_decay"] for g in trainer.optimizer.param_groups] == [0.1, 0.0]


def test_nothing_trainable_is_a_clear_error(tmp_path):
    trainer = trainwell.Trainer(model=nn.Linear(2, 2).requires_grad_(False), args=_args(tmp_path))
    with pytest.raises(ValueError, match="no parameter with requires_grad=True"):
        trainer.create_optimizer()


# ------------------------------------------------------------------------------------------ get_optimizer_cls_and_kwargs
def test_get_optimizer_cls_and_kwargs_is_upstreams_static_hook(tmp_path):
    args = _args(tmp_path, learning_rate=1e-3, adam_beta1=0.8)
    optimizer_cls, kwargs = trainwell.Trainer.get_optimizer_cls_and_kwargs(args)
    assert optimizer_cls is torch.optim.AdamW
    assert kwargs == {"lr": 1e-3, "betas": (0.8, 0.999), "eps": 1e-8, "fused": True}  # the default, upstream's
    assert isinstance(trainwell.Trainer.__dict__["get_optimizer_cls_and_kwargs"], staticmethod)
    transformers = pytest.importorskip("transformers")
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), learning_rate=1e-3, adam_beta1=0.8)
    assert transformers.Trainer.get_optimizer_cls_and_kwargs(theirs) == (optimizer_cls, kwargs)


def test_optimizer_hooks_have_upstreams_signatures():
    import inspect

    transformers = pytest.importorskip("transformers")
    for name in ("create_optimizer", "get_optimizer_cls_and_kwargs", "get_optimizer_group"):
        ours = list(inspect.signature(getattr(trainwell.Trainer, name)).parameters)
        theirs = list(inspect.signature(getattr(transformers.Trainer, name)).parameters)
        assert ours == theirs, name


def test_an_overriding_subclass_gets_its_class_and_kwargs_used(tmp_path):
    seen = []

    class SgdTrainer(trainwell.Trainer):
        @staticmethod
        def get_optimizer_cls_and_kwargs(args, model=None):
            seen.append((args, model))
            return torch.optim.SGD, {"lr": 0.25, "momentum": 0.5}

    model = nn.Sequential(nn.Linear(3, 2))
    trainer = SgdTrainer(model=model, args=_args(tmp_path, weight_decay=0.01))
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.SGD
    assert seen == [(trainer.args, model)]
    assert [(g["lr"], g["momentum"], g["weight_decay"]) for g in optimizer.param_groups] == [
        (0.25, 0.5, 0.01), (0.25, 0.5, 0.0)]
    assert _sizes(optimizer.param_groups) == [1, 1]


class MappingTrainer(trainwell.Trainer):
    """sentence-transformers' pattern: an instance-method override that calls super() and returns its own groups
    under ``optimizer_dict``, one more group for the parameters matching each ``lr_mapping`` pattern."""

    lr_mapping = {r"^1\.": 0.5}

    def get_optimizer_cls_and_kwargs(self, args, model=None):
        optimizer_cls, kwargs = super().get_optimizer_cls_and_kwargs(args, model)
        decay = set(self.get_decay_parameter_names(model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        mapped = {n for n, _ in named for pattern in self.lr_mapping if re.search(pattern, n)}
        kwargs["optimizer_dict"] = [
            {"params": [p for n, p in named if n in decay and n not in mapped], "weight_decay": args.weight_decay},
            {"params": [p for n, p in named if n not in decay and n not in mapped], "weight_decay": 0.0},
        ]
        for pattern, lr in self.lr_mapping.items():
            kwargs["optimizer_dict"].append(
                {"params": [p for n, p in named if re.search(pattern, n)], "lr": lr, "weight_decay": 0.0})
        return optimizer_cls, kwargs


def test_a_learning_rate_mapping_override_gives_several_groups(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    args = _args(tmp_path, learning_rate=1e-2, weight_decay=0.1, max_steps=3, per_device_train_batch_size=4)
    data = [{"input": torch.randn(3), "labels": torch.randn(())} for _ in range(12)]

    class Wrapped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model

        def forward(self, input, labels):
            return {"loss": F.mse_loss(self.net(input).squeeze(-1), labels)}

    trainer = MappingTrainer(model=Wrapped(), args=args, train_dataset=data)
    trainer.lr_mapping = {r"net\.1\.": 0.5}
    trainer.train()
    groups = trainer.optimizer.param_groups
    assert _sizes(groups) == [1, 1, 2]
    assert groups[2]["params"] == [model[1].weight, model[1].bias]
    assert trainer.get_learning_rates() == [0.0, 0.0, 0.0]  # the linear schedule ends at 0 for every group
    assert [g["initial_lr"] for g in groups] == [1e-2, 1e-2, 0.5]


def test_optimizer_cls_and_kwargs_argument_is_used_over_upstreams_groups(tmp_path):
    kwargs = {"lr": 0.1, "momentum": 0.9}
    model = nn.Sequential(nn.Linear(3, 2))
    trainer = trainwell.Trainer(model=model, args=_args(tmp_path, weight_decay=0.05),
                                optimizer_cls_and_kwargs=(torch.optim.SGD, kwargs))
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.SGD and kwargs == {"lr": 0.1, "momentum": 0.9}
    assert [(len(g["params"]), g["weight_decay"], g["momentum"]) for g in optimizer.param_groups] == [
        (1, 0.05, 0.9), (1, 0.0, 0.9)]


def test_an_optimizer_factory_is_called_with_the_model(tmp_path):
    class Factory:
        def __call__(self, model, **kwargs):
            return torch.optim.SGD(model.parameters(), **kwargs)

    class FactoryTrainer(trainwell.Trainer):
        @staticmethod
        def get_optimizer_cls_and_kwargs(args, model=None):
            return Factory, {"lr": 0.2}

    trainer = FactoryTrainer(model=nn.Linear(3, 2), args=_args(tmp_path))
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is torch.optim.SGD and _sizes(optimizer.param_groups) == [2]
    assert optimizer.param_groups[0]["lr"] == 0.2


def test_get_decay_parameter_names_override_decides_the_split(tmp_path):
    class AllDecay(trainwell.Trainer):
        def get_decay_parameter_names(self, model):
            return [n for n, _ in model.named_parameters()]

    trainer = AllDecay(model=nn.Linear(3, 2), args=_args(tmp_path, weight_decay=0.3))
    assert _sizes(trainer.create_optimizer().param_groups) == [2, 0]


# ------------------------------------------------------------------------------- a checkpoint without the empty group
def _drop_the_empty_group(folder: Any) -> None:
    """Rewrite ``folder``'s optimizer.pt of a LoRA-like model without its empty no-decay group (``[2]`` for ``[2, 0]``);
    without the marker the folder resumes as a foreign checkpoint."""
    optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
    assert _sizes(optimizer["param_groups"]) == [2, 0]
    optimizer["param_groups"] = optimizer["param_groups"][:1]
    torch.save(optimizer, folder / "optimizer.pt")
    (folder / COMPLETE_MARKER).unlink()


def test_a_checkpoint_without_the_empty_group_is_refused_with_the_group_sizes(tmp_path):
    def trainer(out: Any) -> trainwell.Trainer:
        args = _args(out, max_steps=6, save_steps=3, per_device_train_batch_size=4, weight_decay=0.1)
        return trainwell.Trainer(model=LoraLike(), args=args, train_dataset=regression_data(24))

    trainer(tmp_path / "full").train()
    shutil.copytree(tmp_path / "full" / "checkpoint-3", tmp_path / "other" / "checkpoint-3")
    _drop_the_empty_group(tmp_path / "other" / "checkpoint-3")
    with pytest.raises(CheckpointError, match=re.escape("sizes [2] in the checkpoint but [2, 0] now")):
        trainer(tmp_path / "other").train(resume_from_checkpoint=str(tmp_path / "other" / "checkpoint-3"))
