"""Messages that name the cause and the fix, and honest speed after a preemption."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import RegressionModel, regression_data, train_until_preempted
from trainwell import Trainer, TrainerCallback, TrainingArguments


def _args(out: Path, **kwargs) -> TrainingArguments:
    defaults = dict(output_dir=str(out), per_device_train_batch_size=4, report_to="none", disable_tqdm=True,
                    logging_steps=1000)
    return TrainingArguments(**{**defaults, **kwargs})


class _SignalAt(TrainerCallback):
    """Sends ``sig`` to this process at the end of step ``step`` (a real signal, as Ctrl-C or a scheduler sends)."""

    def __init__(self, step: int, sig: int = signal.SIGTERM) -> None:
        self.step, self.sig = step, sig

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.sig)


# ------------------------------------------------------------------------------------- speed after a stop


def _steps_and_samples(metrics: dict) -> tuple[float, float]:
    runtime = metrics["train_runtime"]
    return metrics["train_steps_per_second"] * runtime, metrics["train_samples_per_second"] * runtime


def test_speed_after_a_preemption_and_after_a_resume_counts_the_steps_this_call_ran(tmp_path):
    torch.manual_seed(0)
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, max_steps=500, save_steps=1000),
                      train_dataset=regression_data(64), callbacks=[_SignalAt(3)])
    result = train_until_preempted(trainer)
    assert trainer.preempted and result.global_step == 3
    steps, samples = _steps_and_samples(result.metrics)
    assert steps == pytest.approx(3, rel=0.02) and samples == pytest.approx(12, rel=0.02)  # not 500 planned steps

    torch.manual_seed(0)
    resumed = Trainer(model=RegressionModel(), args=_args(tmp_path, max_steps=8, save_steps=1000),
                      train_dataset=regression_data(64))
    result = resumed.train(resume_from_checkpoint=True)
    assert result.global_step == 8
    steps, samples = _steps_and_samples(result.metrics)
    assert steps == pytest.approx(5, rel=0.02) and samples == pytest.approx(20, rel=0.02)  # from step 3 to 8


# ------------------------------------------------------------------------------------------- messages


class _FloatLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        return {"loss": float(((pred - labels) ** 2).mean()), "logits": pred}


def test_a_python_float_loss_is_named_as_such(tmp_path):
    trainer = Trainer(model=_FloatLoss(), args=_args(tmp_path, max_steps=1), train_dataset=regression_data(8))
    with pytest.raises(ValueError) as err:
        trainer.train()
    first = str(err.value).splitlines()[0]
    assert first.startswith("The model returned its loss as a Python float")
    assert "no gradient" in first and "Return the loss tensor itself" in first


class _NoLabels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x):
        return {"logits": self.linear(x)}


def test_forward_without_labels_given_a_labelled_dataset_explains(tmp_path):
    trainer = Trainer(model=_NoLabels(), args=_args(tmp_path, max_steps=1), train_dataset=regression_data(8))
    with pytest.raises(ValueError) as err:
        trainer.train()
    message = str(err.value)
    # as upstream, forward(x) infers label_names=[] and the labels column is dropped as unused: the message says so
    assert message.startswith("The model did not return a loss")
    assert "label_names is []" in message and "dropped as unused" in message
    assert "def forward(self, ..., labels=None)" in message and "compute_loss_func" in message


def test_metric_for_best_model_that_cannot_exist_is_refused_when_the_trainer_is_built(tmp_path):
    args = _args(tmp_path, eval_strategy="steps", eval_steps=1, metric_for_best_model="accuracy")
    with pytest.raises(ValueError, match=r"metric_for_best_model='accuracy' cannot be computed: without "
                                         r"compute_metrics"):
        Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(8),
                eval_dataset=regression_data(8))
    assert not any(tmp_path.iterdir())  # refused before anything was written
    for fine in ("loss", "eval_loss"):  # what an evaluation returns without compute_metrics
        Trainer(model=RegressionModel(), args=_args(tmp_path, eval_strategy="steps", metric_for_best_model=fine),
                train_dataset=regression_data(8), eval_dataset=regression_data(8))
    Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(8), eval_dataset=regression_data(8),
            compute_metrics=lambda p: {"accuracy": 1.0})


def test_infinite_epochs_are_refused_by_the_arguments(tmp_path):
    with pytest.raises(ValueError, match=r"num_train_epochs must be a finite number of epochs \(.*set max_steps.*got num_train_epochs=inf"):
        _args(tmp_path, num_train_epochs=float("inf"))
    assert _args(tmp_path, num_train_epochs=math.inf, max_steps=5).max_steps == 5  # max_steps decides


class _InterruptTheSave:
    """Wraps the checkpoint manager's save: a second Ctrl-C arrives while it writes (a real SIGINT)."""

    def __init__(self, save):
        self.save = save

    def __call__(self, step, *args, **kwargs):
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return self.save(step, *args, **kwargs)


def test_a_second_ctrl_c_during_the_save_names_the_newest_valid_checkpoint(tmp_path):
    torch.manual_seed(0)
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, max_steps=50, save_steps=1),
                      train_dataset=regression_data(64), callbacks=[_SignalAt(2, signal.SIGINT)])
    trainer._tw_checkpoints.manager.save = _InterruptTheSave(trainer._tw_checkpoints.manager.save)
    with pytest.raises(KeyboardInterrupt) as err:
        trainer.train()
    assert str(err.value) == (f"second SIGINT during the save of step 2: quitting without that checkpoint; the newest "
                              f"valid one is {tmp_path / 'checkpoint-1'}")
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1"]


# ---------------------------------------------------------------------------------------- a real full disk


@pytest.fixture
def full_disk(tmp_path):
    """A 6 MB tmpfs (root may mount one here); skipped where mounting is not permitted."""
    folder = tmp_path / "small-disk"
    folder.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command: a real full disk cannot be made here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(folder)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a 6 MB tmpfs is not permitted here ({done.stderr.strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


class _Wide(nn.Module):
    """4 MB of weights: model + AdamW state (12 MB) cannot fit on a 6 MB disk."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1024, 1024)

    def forward(self, x, labels=None):
        return {"loss": self.linear(x).pow(2).mean()}


@pytest.mark.slow
@pytest.mark.parametrize("async_save", [False, True])
def test_a_save_on_a_real_full_disk_says_disk_full_first(full_disk, async_save):
    data = [{"x": torch.ones(1024)}] * 4
    trainer = Trainer(model=_Wide(), args=_args(full_disk, max_steps=1, save_steps=1, async_save=async_save),
                      train_dataset=data)
    with pytest.raises((OSError, RuntimeError)) as err:
        trainer.train()
    first = str(err.value).splitlines()[0]
    if async_save:
        assert first.startswith(f"no space left on the disk of {full_disk} while writing checkpoint-1")
        assert first.endswith("(the background save of checkpoint-1, async_save=True)")
    else:
        assert isinstance(err.value, OSError)
        assert f"no space left on the disk of {full_disk} while writing checkpoint-1" in first
    assert "newest: none" in first and "save_only_model=True" in first
    assert not list(full_disk.glob("*checkpoint-1*"))  # the half-written folder was removed


# ------------------------------------------------------------------------------ the fair messages of bad input


class _LyingLength(torch.utils.data.Dataset):
    """Says 10 items, serves 6."""

    def __init__(self) -> None:
        self.items = regression_data(6)

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index):
        return self.items[index]


def test_a_dataset_whose_len_lies_names_its_len_and_the_index(tmp_path):
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, num_train_epochs=1, save_strategy="no"),
                      train_dataset=_LyingLength())
    with pytest.raises(ValueError) as err:
        trainer.train()
    assert str(err.value) == (
        "The train dataset (_LyingLength) says len() == 10 but train_dataset[6] raises IndexError (list index out of "
        "range); the sampler draws every index below len(), so make _LyingLength.__len__ return the number of items "
        "__getitem__ serves (6 here).")
    assert isinstance(err.value.__cause__, IndexError)


class _Loss(nn.Module):
    """A regression model whose output ``kind`` is wrong in one way."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.linear = kind, nn.Linear(2, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        if self.kind == "per_example":
            return {"loss": (pred - labels) ** 2, "logits": pred}
        loss = ((pred - labels) ** 2).mean()
        if self.kind == "detached":
            return {"loss": loss.detach(), "logits": pred}
        if self.kind == "logits_only":  # (logits,) although labels were given: no loss at all
            return (torch.stack([pred, -pred], dim=-1),)
        return pred, loss  # "logits_first"


def _first_line_of_train_error(tmp_path, model) -> ValueError:
    trainer = Trainer(model=model, args=_args(tmp_path, max_steps=1, save_strategy="no"),
                      train_dataset=regression_data(8))
    with pytest.raises(ValueError) as err:
        trainer.train()
    assert "\n" not in str(err.value)
    return err.value


def test_a_loss_that_is_not_a_single_number_names_its_shape_and_the_reduction(tmp_path):
    error = _first_line_of_train_error(tmp_path, _Loss("per_example"))
    assert str(error).startswith("The loss of _Loss has shape (4,), not a single number, so backward() cannot start")
    assert "loss.mean()" in str(error) and isinstance(error.__cause__, RuntimeError)


def test_a_loss_without_gradient_names_the_likely_causes(tmp_path):
    error = _first_line_of_train_error(tmp_path, _Loss("detached"))
    assert str(error).startswith("The loss of _Loss has no gradient (loss.requires_grad is False)")
    for cause in ("frozen", "torch.no_grad()", "detached"):
        assert cause in str(error)


def test_a_tuple_whose_loss_is_not_first_says_where_the_loss_is(tmp_path):
    error = _first_line_of_train_error(tmp_path, _Loss("logits_first"))
    assert str(error).startswith("The model returned a tuple whose first element is a tensor of shape (4,), not the "
                                 "loss; Trainer reads the loss from the first element and the single number at "
                                 "position 1 looks like it")


def test_a_tuple_of_logits_only_says_the_first_element_is_taken_as_the_loss(tmp_path):
    error = _first_line_of_train_error(tmp_path, _Loss("logits_only"))
    assert str(error).startswith("The model returned a tuple of 1 element(s) and Trainer takes the first as the "
                                 "loss, but it is a tensor of shape (4, 2) (logits?)")
    assert "return (loss, logits, ...) with the loss first" in str(error) and "mean output" in str(error)


def test_a_text_column_names_the_column_and_the_three_fixes(tmp_path):
    data = [{**row, "words": ["a", "b"]} for row in regression_data(8)]
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, max_steps=1, save_strategy="no",
                                                          remove_unused_columns=False), train_dataset=data)
    with pytest.raises(ValueError) as err:
        trainer.train()
    message = str(err.value)
    assert message.startswith("The dataset's 'words' column holds text (e.g. 'a'), which the data collator cannot "
                              "turn into a tensor")
    for fix in ("tokenize it", "remove_unused_columns=True", "data_collator"):
        assert fix in message


def test_a_text_column_through_a_tokenizer_pad_names_the_column():
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from trainwell import DataCollatorWithPadding

    vocab = {"[PAD]": 0, "a": 1, "[UNK]": 2}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                        pad_token="[PAD]")
    with pytest.raises(ValueError, match=r"^The dataset's 'text' column holds text \(e.g. 'hello'\)"):
        DataCollatorWithPadding(tokenizer)([{"input_ids": [1, 1], "text": "hello"}, {"input_ids": [1], "text": "x"}])


class _TwoInterrupts(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # asks for a save and a stop
            os.kill(os.getpid(), signal.SIGINT)  # before it is done: out now


def test_a_second_ctrl_c_before_the_save_says_it_stops_now_without_saving(tmp_path):
    previous = signal.getsignal(signal.SIGINT)
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, max_steps=50, save_steps=1000),
                      train_dataset=regression_data(64), callbacks=[_TwoInterrupts()])
    with pytest.raises(KeyboardInterrupt) as err:
        trainer.train()
    assert str(err.value) == ("second SIGINT after the SIGINT that asked for a checkpoint and a stop: stopping now, "
                              "without saving that checkpoint")
    assert not list(tmp_path.glob("checkpoint-*"))
    assert signal.getsignal(signal.SIGINT) is previous


def test_an_async_save_at_a_preemption_says_saving_then_saved_once_committed(tmp_path, monkeypatch):
    import logging
    import time

    from trainwell.checkpoint.layout import is_complete
    from trainwell.checkpoint.manager import CheckpointManager

    slow_save = CheckpointManager.save

    def save(self, *args, **kwargs):  # a background write that takes a while, as a big model's does
        time.sleep(0.5)
        return slow_save(self, *args, **kwargs)

    monkeypatch.setattr(CheckpointManager, "save", save)
    seen: list[tuple[str, bool]] = []

    class Recorder(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if "preempted" in message:
                seen.append((message, is_complete(tmp_path / "checkpoint-3")))

    handler = Recorder()
    logging.getLogger("trainwell").addHandler(handler)
    try:
        torch.manual_seed(0)
        trainer = Trainer(model=RegressionModel(), args=_args(tmp_path, max_steps=50, save_steps=1000,
                                                               async_save=True),
                          train_dataset=regression_data(64), callbacks=[_SignalAt(3)])
        train_until_preempted(trainer)
    finally:
        logging.getLogger("trainwell").removeHandler(handler)
    assert [("saving checkpoint in" in m, "checkpoint saved in" in m) for m, _ in seen] == [(True, False),
                                                                                          (False, True)]
    assert [complete for _, complete in seen] == [False, True]  # "saved" only once the marker is written
    assert str(tmp_path / "checkpoint-3") in seen[1][0] and "resume" in seen[1][0]


@pytest.mark.parametrize("kind", ["file", "latest"])
def test_resume_from_a_file_or_a_guessed_word_names_what_to_pass(tmp_path, kind):
    inside = tmp_path / "checkpoint-2" / "model.safetensors"
    inside.parent.mkdir()
    inside.write_bytes(b"")
    value = str(inside) if kind == "file" else "latest"
    trainer = Trainer(model=RegressionModel(), args=_args(tmp_path / "out", max_steps=1, save_strategy="no"),
                      train_dataset=regression_data(8))
    with pytest.raises(ValueError) as err:
        trainer.train(resume_from_checkpoint=value)
    expected = (f"a file; pass the checkpoint folder that holds it: {inside.parent}" if kind == "file" else
                "for the newest checkpoint of output_dir pass resume_from_checkpoint=True (or 'auto'")
    assert str(err.value).startswith(f"Can't find a valid checkpoint at {value}") and expected in str(err.value)
