"""Former module paths and upstream's module names import the very modules that now live elsewhere."""

from __future__ import annotations

import importlib

import pytest

import trainwell


@pytest.mark.parametrize("old,new", sorted(trainwell._MOVED.items()))
def test_a_former_path_is_the_same_module(old, new):
    alias, real = importlib.import_module(f"trainwell.{old}"), importlib.import_module(f"trainwell.{new}")
    assert alias is real
    assert real.__spec__.name == f"trainwell.{new}"  # the alias did not rename the module


def test_upstream_module_names_give_the_public_objects():
    from trainwell.debug_utils import DebugUnderflowOverflow
    from trainwell.integrations import WandbCallback
    from trainwell.tf import TFTrainingArguments
    from trainwell.trainer_utils import IntervalStrategy, get_last_checkpoint

    assert IntervalStrategy is trainwell.IntervalStrategy and get_last_checkpoint is trainwell.get_last_checkpoint
    assert WandbCallback is trainwell.WandbCallback
    assert DebugUnderflowOverflow.__module__ == "trainwell.loops.underflow_overflow"
    assert TFTrainingArguments.__module__ == "trainwell.compat.tf.args"


def test_a_monkeypatch_through_a_former_path_reaches_the_code(monkeypatch):
    import trainwell.distributed as former
    from trainwell.runtime import distributed

    monkeypatch.setattr(former, "_probe_attribute", 1, raising=False)
    assert distributed._probe_attribute == 1


def test_a_submodule_of_a_moved_package_follows_it():
    from trainwell.cli.commands import plot
    from trainwell.commands import plot as former

    assert former is plot


def test_an_unknown_former_name_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("trainwell.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("trainwell.zero")  # a deleted re-export shim
