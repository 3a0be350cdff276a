"""accelerate's process state exists once the arguments do, as with upstream's ``TrainingArguments`` (which builds
accelerate's ``PartialState`` in ``__post_init__``): a warning through ``accelerate.logging`` between the arguments
and the Trainer used to raise ``RuntimeError: You must initialize the accelerate state...`` (issue 41)."""

from __future__ import annotations

import logging

import pytest

import trainwell

accelerate_state = pytest.importorskip("accelerate.state")
accelerate_logging = pytest.importorskip("accelerate.logging")


@pytest.fixture
def no_accelerate_state():
    """No accelerate state before the test (as in a fresh script), none left behind."""
    accelerate_state.AcceleratorState._reset_state(reset_partial_state=True)
    yield
    accelerate_state.AcceleratorState._reset_state(reset_partial_state=True)


def warn_through_accelerate(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=__name__):
        accelerate_logging.get_logger(__name__).warning("between the arguments and the Trainer")
    assert "between the arguments and the Trainer" in caplog.text


def test_accelerate_logging_works_after_the_arguments(tmp_path, caplog, no_accelerate_state):
    with pytest.raises(RuntimeError, match="initialize the accelerate state"):  # the oracle's precondition
        accelerate_logging.get_logger(__name__).warning("before any arguments")
    args = trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    warn_through_accelerate(caplog)
    state = accelerate_state.PartialState()
    assert (state.num_processes, state.process_index, state.device.type) == (1, 0, "cpu")
    assert "_runtime_cache" not in args.__dict__  # trainwell's own device resolution stays lazy


def test_an_existing_state_is_kept(tmp_path, no_accelerate_state):
    made = accelerate_state.PartialState(cpu=True)
    trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert accelerate_state.PartialState().device == made.device and accelerate_state.PartialState._shared_state


@pytest.mark.slow  # the oracle: upstream's TrainingArguments (its first construction loads modules, over a second)
def test_upstream_arguments_do_the_same(tmp_path, caplog, no_accelerate_state):
    transformers = pytest.importorskip("transformers")
    transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    warn_through_accelerate(caplog)
