"""Upstream's module names (``trainwell.trainer_utils``, ``trainwell.integrations``, ``trainwell.debug_utils``) and
``trainwell.tf`` import the very modules that live in ``trainwell.compat``; no other path stands for another module."""

from __future__ import annotations

import importlib

import pytest

import trainwell

UPSTREAM_NAMES = ["debug_utils", "integrations", "tf", "trainer_utils"]


@pytest.mark.parametrize("name", UPSTREAM_NAMES)
def test_an_upstream_name_is_the_compat_module(name):
    module, real = importlib.import_module(f"trainwell.{name}"), importlib.import_module(f"trainwell.compat.{name}")
    assert module is real
    assert getattr(trainwell, name) is real  # `import trainwell.<name>; trainwell.<name>.X` works too
    assert real.__spec__.name == f"trainwell.compat.{name}"


def test_upstream_module_names_give_the_public_objects():
    from trainwell.debug_utils import DebugUnderflowOverflow
    from trainwell.integrations import WandbCallback
    from trainwell.tf import TFTrainingArguments
    from trainwell.trainer_utils import IntervalStrategy, get_last_checkpoint

    assert IntervalStrategy is trainwell.IntervalStrategy and get_last_checkpoint is trainwell.get_last_checkpoint
    assert WandbCallback is trainwell.WandbCallback
    assert DebugUnderflowOverflow.__module__ == "trainwell.loops.underflow_overflow"
    assert TFTrainingArguments.__module__ == "trainwell.compat.tf.args"


def test_a_monkeypatch_through_the_upstream_name_reaches_the_code(monkeypatch):
    import trainwell.trainer_utils as upstream_name
    from trainwell.compat import trainer_utils

    monkeypatch.setattr(upstream_name, "_probe_attribute", 1, raising=False)
    assert trainer_utils._probe_attribute == 1


@pytest.mark.parametrize("name", ["no_such_module", "distributed", "seq2seq_args", "commands", "zero"])
def test_any_other_top_level_name_is_an_import_error(name):
    """Only the real layout imports: ``trainwell.runtime.distributed``, not ``trainwell.distributed``."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"trainwell.{name}")
