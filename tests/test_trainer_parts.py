"""The Trainer's contract with its backend and its subclasses: every backend hook is in the Protocol (called, never
looked up by name), and a user subclass's own names never collide with trainwell's private state."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trainwell import Trainer
from trainwell.backends.base import Backend, Capabilities
from trainwell.backends.ddp import DDPBackend
from trainwell.backends.deepspeed.backend import DeepSpeedBackend
from trainwell.backends.fsdp import FSDPBackend
from trainwell.backends.single import SingleDeviceBackend


def _protocol_members() -> tuple[set[str], set[str]]:
    """(attributes, methods) the Backend Protocol declares."""
    attributes = set(Backend.__annotations__)
    methods = {name for name, value in vars(Backend).items() if inspect.isfunction(value) and not name.startswith("_")}
    return attributes, methods


def _assigned_in_init(cls: type) -> set[str]:
    """``self.<name> = ...`` targets of the ``__init__`` of ``cls`` and its bases (attributes an instance of a class
    not built here has)."""
    found: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass.__module__.startswith("trainwell."):
            tree = ast.parse(inspect.getsource(klass.__init__).strip())
            found |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                      and node.value.id == "self"}
    return found


def test_single_device_backend_provides_every_hook_with_its_default(make_args):
    attributes, methods = _protocol_members()
    assert {"input_dtype", "engine", "scaler", "ds_config", "num_training_steps"} <= attributes
    assert {"gathered_parameters", "check_checkpoint"} <= methods
    backend = Trainer(model=torch.nn.Linear(2, 1), args=make_args()).backend
    assert type(backend) is SingleDeviceBackend
    missing = [name for name in attributes | methods if not hasattr(backend, name)]
    assert not missing, f"SingleDeviceBackend lacks the Protocol members {missing}"
    # the defaults: inputs keep their dtype, no engine, no DeepSpeed config, nothing gathered nor checked
    assert backend.input_dtype is None and backend.engine is None and backend.ds_config is None
    assert backend.scaler is not None and not backend.scaler.is_enabled()  # fp16 off: a disabled scaler
    with backend.gathered_parameters():
        pass
    assert backend.check_checkpoint(Path("missing-folder")) is None
    assert backend.caps.fixed_micro_batch_size is False


@pytest.mark.parametrize("cls", [DDPBackend, FSDPBackend, DeepSpeedBackend])
def test_every_backend_class_has_every_protocol_member(cls):
    attributes, methods = _protocol_members()
    own = _assigned_in_init(cls) | set(dir(cls))  # DeepSpeed is not built here: it needs the package and a group
    missing = sorted(name for name in attributes | methods if name not in own)
    assert not missing, f"{cls.__name__} lacks the Protocol members {missing}"


def test_deepspeed_backend_declares_a_fixed_micro_batch_size():
    source = inspect.getsource(DeepSpeedBackend.__init__)
    assert "fixed_micro_batch_size=True" in source
    assert Capabilities().fixed_micro_batch_size is False


def test_auto_find_batch_size_is_refused_by_a_backend_that_fixes_the_micro_batch(tiny, make_args):
    """loops/batch_size.py asks the capability (not ``args.deepspeed``): any backend declaring it is refused."""
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(auto_find_batch_size=True, max_steps=1),
                      train_dataset=tiny.regression_data(16))
    trainer.backend.caps = replace(trainer.backend.caps, fixed_micro_batch_size=True)
    with pytest.raises(ValueError, match="auto_find_batch_size is not supported with DeepSpeed"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer.backend.caps = replace(trainer.backend.caps, fixed_micro_batch_size=False)
    assert trainer.train().global_step == 1  # the same trainer trains once the backend allows it
