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


def test_every_name_trainer_utils_lists_resolves():
    """``trainwell.trainer_utils`` gives each name from the module holding it: every name ``dir()`` lists resolves,
    to the object of its home (the enums, result tuples, seeding and checkpoint names live in trainwell.utils)."""
    import trainwell.trainer_utils as module

    for name in dir(module):
        getattr(module, name)  # an AttributeError names a table entry whose home lacks it
    assert {"set_seed", "seed_worker", "enable_full_determinism", "PREFIX_CHECKPOINT_DIR", "is_checkpoint_name",
            "TrainOutput", "EvalPrediction", "EvalLoopOutput", "PredictionOutput", "BestRun", "IntervalStrategy",
            "EvaluationStrategy", "ExplicitEnum", "ShardedDDPOption", "get_last_checkpoint"} <= set(dir(module))
    assert module.set_seed.__module__ == "trainwell.utils.seeding"
    assert module.TrainOutput.__module__ == "trainwell.utils.outputs"
    assert module.IntervalStrategy.__module__ == "trainwell.utils.option_enums"
    with pytest.raises(AttributeError):
        module.no_such_name
