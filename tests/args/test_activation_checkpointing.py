"""Upstream 5.24's ``activation_checkpointing`` / ``activation_checkpointing_kwargs`` fields
(``gradient_checkpointing*`` their deprecated aliases, mirrored after ``__post_init__``) and ``ddp_static_graph``
(DDP's ``static_graph``), with upstream's defaults, help and resolution; ``every_n_layers`` and ``offload`` come out
of the kwargs as upstream's Trainer takes them out."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
from torch import nn

import trainwell
from trainwell.utils.model_utils import enable_gradient_checkpointing

transformers = pytest.importorskip("transformers")

FIELDS = ("activation_checkpointing", "activation_checkpointing_kwargs", "gradient_checkpointing",
          "gradient_checkpointing_kwargs", "ddp_static_graph")


def _resolved(lib, tmp_path, **kwargs) -> tuple[dict, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = lib.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
    future = sorted(str(w.message) for w in caught if w.category is FutureWarning and "checkpointing" in str(w.message))
    return {name: getattr(args, name) for name in FIELDS}, future


@pytest.mark.parametrize("kwargs", [
    {},
    {"activation_checkpointing": True, "activation_checkpointing_kwargs": {"use_reentrant": False}},
    {"gradient_checkpointing": True},
    {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": '{"use_reentrant": false}'},
    {"activation_checkpointing": False, "gradient_checkpointing": True},  # the new name wins
    {"ddp_static_graph": True},
], ids=["defaults", "new_names", "alias", "alias_json_kwargs", "new_name_wins", "static_graph"])
def test_fields_resolve_as_upstream(tmp_path, kwargs):
    ours, our_warnings = _resolved(trainwell, tmp_path, **kwargs)
    theirs, their_warnings = _resolved(transformers, tmp_path, **kwargs)
    assert ours == theirs and our_warnings == their_warnings
    assert ours["activation_checkpointing"] == ours["gradient_checkpointing"] is not None


def test_defaults_and_help_are_upstreams():
    ours = {f.name: f for f in dataclasses.fields(trainwell.TrainingArguments)}
    theirs = {f.name: f for f in dataclasses.fields(transformers.TrainingArguments)}
    for name in FIELDS:
        assert ours[name].default == theirs[name].default
        assert ours[name].metadata["help"] == theirs[name].metadata["help"].replace("%%", "%")


def test_set_training_takes_the_new_name_and_the_alias(tmp_path):
    for lib in (trainwell, transformers):
        args = lib.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
        assert args.set_training(activation_checkpointing=True).gradient_checkpointing is True
        with pytest.warns(FutureWarning, match="gradient_checkpointing"):
            args.set_training(gradient_checkpointing=False)
        assert args.activation_checkpointing is False


def test_ddp_static_graph_reaches_ddp(tmp_path):
    from trainwell.backends.ddp import DDPBackend

    def ddp_kwargs(**kwargs):
        args = trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kwargs)
        backend = DDPBackend.__new__(DDPBackend)
        backend.args, backend.device = args, args.device
        return backend.ddp_kwargs()

    assert "static_graph" not in ddp_kwargs()  # unset: DDP's own default, as upstream
    assert ddp_kwargs(ddp_static_graph=True)["static_graph"] is True
    assert ddp_kwargs(activation_checkpointing=True)["find_unused_parameters"] is False


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(4))

    def forward(self, x, labels=None):
        for block in self.blocks:
            x = block(x)
        return {"loss": ((x.sum(-1) - labels) ** 2).mean()}


def test_every_n_layers_and_offload_on_a_plain_module():
    model = Stack()
    assert enable_gradient_checkpointing(model, {"every_n_layers": 2, "offload": True}) == 2
    assert [getattr(b, "_trainwell_checkpointed", False) for b in model.blocks] == [True, False, True, False]
    x, y = torch.randn(3, 4), torch.randn(3)
    model(x, labels=y)["loss"].backward()  # offload: the checkpointed inputs wait on the host
    with torch.no_grad():
        reference = Stack()
    reference(x, labels=y)["loss"].backward()
    for ours, theirs in zip(model.parameters(), reference.parameters()):
        assert torch.equal(ours.grad, theirs.grad)


def test_a_transformers_model_gets_every_n_layers_and_offload():
    calls = []

    class Model(nn.Module):
        def activation_checkpointing_enable(self, **kwargs):
            calls.append(kwargs)

    enable_gradient_checkpointing(Model(), {"every_n_layers": 3, "use_reentrant": False})
    assert calls == [{"activation_checkpointing_kwargs": {"use_reentrant": False}, "every_n_layers": 3,
                      "offload": False}]  # as upstream's Trainer calls it
