"""Upstream's own tests that failed on trainwell with their imports swapped (issue 41, fault 9), each body run on
``transformers`` and on trainwell in the same test.

Read from huggingface/transformers (the stored snapshots): ``tests/utils/test_hf_argparser.py`` at 01c2043f
(``test_with_literal``; that snapshot names it ``test_04_with_literal``), ``tests/trainer/test_trainer_callback.py``
at 63d7259e (``test_stateful_mixed_callbacks``, ``test_missing_stateful_callback``),
``tests/trainer/test_trainer_data.py`` at 003432ac (``test_get_eval_dataloader_with_persistent_workers``,
``test_dataloader_without_dataset``, ``test_label_smoothing_multi_label_incompatibility``), ``test_training_args.py``
(``test_torch_empty_cache_steps_requirements``), ``tests/trainer/test_trainer.py`` at 9aecbdff (``test_log_level``,
``test_metric_for_best_model_behavior``); the shared ``trainer_test_utils.py`` at 2d754248. Each body is upstream's,
with the repository's tiny regression model and data in place of upstream's fixtures.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import warnings
from dataclasses import dataclass
from typing import Literal
from unittest.mock import patch

import pytest
import torch
from torch import nn

import trainwell
from helpers.data import regression_data
from helpers.models import RegressionModel

transformers = pytest.importorskip("transformers")

LIBS = [pytest.param(transformers, id="transformers"), pytest.param(trainwell, id="trainwell")]


def _args(lib, output_dir, **kw):
    common = dict(report_to="none", use_cpu=True, disable_tqdm=True, per_device_train_batch_size=8,
                  per_device_eval_batch_size=8)
    common.update(kw)
    return lib.TrainingArguments(str(output_dir), **common)


def _trainer(lib, output_dir, *, trainer_cls=None, callbacks=None, train=16, evaluation=16, **kw):
    torch.manual_seed(0)
    return (trainer_cls or lib.Trainer)(model=RegressionModel(), args=_args(lib, output_dir, **kw),
                                        train_dataset=regression_data(train), eval_dataset=regression_data(evaluation),
                                        callbacks=callbacks)


# ----------------------------------------------------------------------------------------- HfArgumentParser
@dataclass
class LiteralExample:
    foo: Literal["titi", "toto", 42] = "toto"


@pytest.mark.parametrize("lib", LIBS)
def test_with_literal(lib):
    """A Literal's choices are its own tuple, as upstream's parser keeps them: upstream's test compares them with
    an expected tuple (``yy["choices"] + xx["choices"]``: a list here raised TypeError)."""
    from transformers.hf_argparser import make_choice_type_function

    parser = lib.HfArgumentParser(LiteralExample)
    expected = argparse.ArgumentParser()
    expected.add_argument("--foo", default="toto", choices=("titi", "toto", 42),
                          type=make_choice_type_function(["titi", "toto", 42]))
    assert len(parser._actions) == len(expected._actions)
    for x, y in zip(parser._actions, expected._actions):
        xx = {k: v for k, v in vars(x).items() if k != "container"}
        yy = {k: v for k, v in vars(y).items() if k != "container"}
        if xx.get("choices") and yy.get("choices"):
            for choice in yy["choices"] + xx["choices"]:
                assert xx["type"](choice) == yy["type"](choice)
            del xx["type"], yy["type"]
        assert xx == yy
    assert parser.parse_args([]).foo == "toto"
    assert parser.parse_args(["--foo", "titi"]).foo == "titi"
    assert parser.parse_args(["--foo", "42"]).foo == 42


# ------------------------------------------------------------------------------------------- TrainingArguments
@pytest.mark.parametrize("lib", LIBS)
def test_torch_empty_cache_steps_requirements(lib, tmp_path):
    assert lib.TrainingArguments(str(tmp_path), torch_empty_cache_steps=None).torch_empty_cache_steps is None
    for bad in (1.0, "none", -1, 0):  # trainwell's type check refuses "none" first: a TypeError and a ValueError
        with pytest.raises(ValueError):
            lib.TrainingArguments(str(tmp_path), torch_empty_cache_steps=bad)
    assert lib.TrainingArguments(str(tmp_path), torch_empty_cache_steps=1).torch_empty_cache_steps == 1
    if lib is trainwell:
        with pytest.raises(TypeError, match="torch_empty_cache_steps must be int, got str 'none'"):
            lib.TrainingArguments(str(tmp_path), torch_empty_cache_steps="none")


# ----------------------------------------------------------------------------------------------- Trainer init
@pytest.mark.parametrize("lib", LIBS)
def test_label_smoothing_multi_label_incompatibility(lib, tmp_path):
    class MockConfig:
        problem_type = "multi_label_classification"

    class MockModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = MockConfig()
            self.linear = nn.Linear(10, 3)

        def forward(self, **kwargs):
            return {"logits": torch.randn(2, 3)}

    args = lib.TrainingArguments(output_dir=str(tmp_path), label_smoothing_factor=0.1, per_device_train_batch_size=2,
                                 num_train_epochs=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = lib.Trainer(model=MockModel(), args=args)
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "Label smoothing is not compatible with multi-label classification" in str(caught[0].message)
    assert trainer.label_smoother is None


@pytest.mark.parametrize("lib", LIBS)
def test_metric_for_best_model_behavior(lib, tmp_path):
    with pytest.raises(ValueError) as caught:
        _trainer(lib, tmp_path, eval_strategy="epoch", save_strategy="best")
    assert "`args.metric_for_best_model` must be provided" in str(caught.value)
    trainer = _trainer(lib, tmp_path, eval_strategy="steps", save_strategy="steps", load_best_model_at_end=True)
    assert trainer.args.metric_for_best_model == "loss"


# ------------------------------------------------------------------------------------------------ DataLoaders
@pytest.mark.parametrize("lib", LIBS)
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "not-persistent"])
def test_get_eval_dataloader_with_persistent_workers(lib, tmp_path, persistent):
    """Under ``dataloader_persistent_workers`` each evaluation set keeps one loader (so its workers persist);
    without, every call builds a new one. No loader is iterated: no worker starts."""
    workers = dict(dataloader_persistent_workers=True, dataloader_num_workers=2) if persistent else {}
    args = _args(lib, tmp_path, **workers)
    eval_dataset = regression_data(8)
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=regression_data(8), eval_dataset=eval_dataset)
    trainer.accelerator.prepare = lambda x: x  # as upstream's test: the loader is not changed by each call
    default, with_dataset = trainer.get_eval_dataloader(), trainer.get_eval_dataloader(eval_dataset)
    assert default.dataset is eval_dataset and with_dataset.dataset is eval_dataset
    assert (default is with_dataset) is persistent

    first, second = regression_data(8), regression_data(8, seed=1)
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=regression_data(8),
                          eval_dataset={"first": first, "second": second})
    trainer.accelerator.prepare = lambda x: x
    loaders = [trainer.get_eval_dataloader(name) for name in ("first", "first", "second", "second")]
    assert [loader.dataset for loader in loaders] == [first, first, second, second]
    assert (loaders[0] is loaders[1]) is persistent and (loaders[2] is loaders[3]) is persistent
    assert loaders[0] is not loaders[2]


def test_a_persistent_eval_loader_is_not_reused_for_another_dataset(tmp_path):
    """The difference kept (README): upstream returns the first loader for any dataset passed to
    ``get_eval_dataloader`` under ``dataloader_persistent_workers`` (its key is "eval" for every dataset object), so
    ``evaluate(other)`` evaluates the first dataset again; trainwell keeps a loader only for the dataset it was
    built over."""
    args = dict(dataloader_persistent_workers=True, dataloader_num_workers=2)
    found = {}
    for lib in (transformers, trainwell):
        trainer = lib.Trainer(RegressionModel(), _args(lib, tmp_path, **args), train_dataset=regression_data(8),
                              eval_dataset=regression_data(8))
        trainer.accelerator.prepare = lambda x: x
        trainer.get_eval_dataloader()
        found[lib.__name__] = len(trainer.get_eval_dataloader(regression_data(4)).dataset)
    assert found == {"transformers": 8, "trainwell": 4}


class _MultiLoader:
    """upstream's MultiLoader: batches of several loaders in turn, with a length and no ``dataset``."""

    def __init__(self, loaders):
        self.loaders = loaders

    def __len__(self):
        return sum(len(loader) for loader in self.loaders)

    def __iter__(self):
        for loader in self.loaders:
            yield from loader


@pytest.mark.slow  # trains and evaluates on both libraries
@pytest.mark.parametrize("lib", LIBS)
def test_dataloader_without_dataset(lib, tmp_path):
    """A loader of the user's own without a ``.dataset`` attribute (upstream's CustomDataloaderTrainer) trains
    and evaluates; the number of examples is then counted as batches x batch size."""

    class CustomDataloaderTrainer(lib.Trainer):
        def get_train_dataloader(self):
            return _MultiLoader([super().get_train_dataloader(), super().get_train_dataloader()])

        def get_eval_dataloader(self, eval_dataset):
            return _MultiLoader([super().get_eval_dataloader(eval_dataset),
                                 super().get_eval_dataloader(eval_dataset)])

    trainer = _trainer(lib, tmp_path, trainer_cls=CustomDataloaderTrainer, num_train_epochs=1)
    trainer.train()
    assert trainer.state.global_step == 4  # 2 x 16 rows in batches of 8
    assert "eval_loss" in trainer.evaluate()


# ----------------------------------------------------------------------------------------- stateful callbacks
def _callback_classes(lib):
    class MyTestTrainerCallback(lib.TrainerCallback):
        """A callback that keeps no exportable state."""

        def __init__(self, my_test_state="test"):
            self.my_test_state = my_test_state

    return MyTestTrainerCallback


_SAVE_EVAL = dict(load_best_model_at_end=True, save_strategy="steps", eval_strategy="steps", save_steps=2,
                  eval_steps=2, max_steps=2)


@pytest.mark.slow  # trains, saves and resumes on both libraries
@pytest.mark.parametrize("lib", LIBS)
def test_stateful_mixed_callbacks(lib, tmp_path):
    """The restored (exportable) callback moves behind the others, as upstream's ``_load_callback_state`` re-adds
    the callbacks it rebuilt: upstream's test unpacks them in that order."""
    MyTestTrainerCallback = _callback_classes(lib)
    callbacks = [MyTestTrainerCallback(my_test_state="another value"),
                 lib.EarlyStoppingCallback(early_stopping_patience=5, early_stopping_threshold=0.2)]
    _trainer(lib, tmp_path, callbacks=callbacks, **_SAVE_EVAL).train()

    early = lib.EarlyStoppingCallback()
    trainer = _trainer(lib, tmp_path, callbacks=[early, MyTestTrainerCallback()],
                       restore_callback_states_from_checkpoint=True, **_SAVE_EVAL)
    trainer.train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-2"))
    found = [cb for cb in trainer.callback_handler.callbacks
             if isinstance(cb, (lib.EarlyStoppingCallback, MyTestTrainerCallback))]
    assert len(found) == 2
    my_test, early_stopping = found
    assert early_stopping.early_stopping_patience == 5
    assert early_stopping.early_stopping_threshold == 0.2
    assert my_test.my_test_state == "test"
    if lib is trainwell:  # the object passed in is the one restored (references the user holds see its state)
        assert early_stopping is early


@pytest.mark.slow  # trains, saves and resumes on both libraries
@pytest.mark.parametrize("lib", LIBS)
def test_missing_stateful_callback(lib, tmp_path):
    _trainer(lib, tmp_path, callbacks=[lib.EarlyStoppingCallback()], **_SAVE_EVAL).train()
    trainer = _trainer(lib, tmp_path, restore_callback_states_from_checkpoint=True, save_strategy="steps",
                       eval_strategy="steps", save_steps=2, eval_steps=2, max_steps=2)
    # upstream's test patches the trainer module's logger: trainwell's is `trainwell.trainer.logger`
    with patch(f"{lib.__name__}.trainer.logger.warning") as warn_mock:
        trainer.train(resume_from_checkpoint=os.path.join(tmp_path, "checkpoint-2"))
    assert any("EarlyStoppingCallback" in (args[0][0] or args[0][1]) for args in warn_mock.call_args_list)


# ------------------------------------------------------------------------------------------------- log_level
def _captured_runs(lib, tmp_path) -> dict[str, bool]:
    """Whether "Running training" reaches the library's logger, with the default ``log_level`` (passive: the
    library's verbosity, WARNING by default) and, under an INFO verbosity, with ``log_level`` debug and error."""
    if lib is transformers:
        from transformers.utils import logging as lib_logging
    else:
        from trainwell.utils import logging_utils as lib_logging
    logger = lib_logging.get_logger()
    seen = {}
    before = lib_logging.get_verbosity()
    try:
        for name, verbosity, log_level in (("default", before, "passive"), ("debug", logging.INFO, "debug"),
                                           ("error", logging.INFO, "error")):
            lib_logging.set_verbosity(verbosity)
            stream = io.StringIO()
            handler = logging.StreamHandler(stream)
            logger.addHandler(handler)
            try:
                _trainer(lib, tmp_path / name, log_level=log_level, max_steps=1).train()
            finally:
                logger.removeHandler(handler)
            seen[name] = "Running training" in stream.getvalue()
    finally:
        lib_logging.set_verbosity(before)
    seen["default verbosity is info"] = before <= logging.INFO
    return seen


@pytest.mark.slow  # trains three times on both libraries
def test_log_level(tmp_path):
    """The "***** Running training *****" summary is logged at INFO, so ``log_level`` decides whether it shows."""
    upstream = _captured_runs(transformers, tmp_path / "transformers")
    ours = _captured_runs(trainwell, tmp_path / "trainwell")
    for seen in (upstream, ours):
        assert seen["default"] is seen["default verbosity is info"]
        assert seen["debug"] and not seen["error"]
