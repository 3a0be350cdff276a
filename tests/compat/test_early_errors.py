"""Errors come before work is lost, and name the problem and the fix.

Each test is a user's first script going wrong: the error now comes from the constructor (or, for a metric only
known after an evaluation, after the checkpoint due at that step was written), never a raw ``OSError`` at the first
save or a ``KeyError`` deep inside the DataLoader. Where upstream raises the same error, both are compared.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch

import trainwell
from trainwell import Trainer, TrainingArguments
from helpers.models import SeededRegressor

N, DIM = 10, 3


def rows(n: int = N) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, DIM, generator=g)
    return [{"x": x[i], "labels": x[i].sum()} for i in range(n)]


def _args(lib, output_dir, **kw):
    common = dict(output_dir=str(output_dir), per_device_train_batch_size=4, report_to="none", use_cpu=True,
                  disable_tqdm=True, save_strategy="no")
    common.update(kw)
    return lib.TrainingArguments(**common)


def _tree(root) -> dict[str, bytes]:
    return {os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
            for d, _, files in os.walk(root) for f in files}


# ------------------------------------------------------------------------------------------------ output_dir
def test_output_dir_that_is_a_file_fails_in_the_constructor_and_the_file_is_untouched(tmp_path):
    target = tmp_path / "results"
    target.write_text("my notes")
    args = _args(trainwell, target, save_strategy="steps", save_steps=1, max_steps=2)
    with pytest.raises(ValueError, match=r"output_dir=.*results.* is an existing file.*pass another output_dir"):
        Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows())
    assert _tree(tmp_path) == {"results": b"my notes"}


def test_output_dir_under_a_file_fails_in_the_constructor(tmp_path):
    (tmp_path / "a_file").write_text("x")
    args = _args(trainwell, tmp_path / "a_file" / "run", save_strategy="steps", save_steps=1, max_steps=2)
    with pytest.raises(ValueError, match=r"cannot be created: .*a_file.* is a file"):
        Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows())
    assert _tree(tmp_path) == {"a_file": b"x"}


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root can write into a read-only folder")
def test_output_dir_not_writable_fails_in_the_constructor(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        args = _args(trainwell, locked / "run", save_strategy="steps", save_steps=1, max_steps=2)
        with pytest.raises(PermissionError, match="is not writable"):
            Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows())
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("read_only", [True, False])
def test_output_dir_on_a_read_only_mount_says_read_only_file_system(tmp_path, monkeypatch, read_only):
    """Root may write anywhere, so the mount is faked: access(2) refuses (as it does with EROFS) and statvfs says
    whether the file system is mounted read-only."""
    from types import SimpleNamespace

    from trainwell.utils import preflight

    monkeypatch.setattr(preflight.os, "access", lambda path, mode: False)
    monkeypatch.setattr(preflight.os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY if read_only else 0))
    args = _args(trainwell, tmp_path / "run", save_strategy="steps", save_steps=1, max_steps=2)
    with pytest.raises(OSError) as err:
        Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows())
    if read_only:
        assert err.value.errno == errno.EROFS and not isinstance(err.value, PermissionError)
        assert f"is on a read-only file system (the nearest existing folder is {str(tmp_path)!r})" in str(err.value)
        assert "is not writable by this user" not in str(err.value)
    else:
        assert isinstance(err.value, PermissionError) and "is not writable by this user" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_output_dir_not_written_is_not_checked_for_writing(tmp_path):
    # save_strategy="no": nothing is saved, so a missing output_dir is fine (nothing is created either)
    trainer = Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path / "new"), eval_dataset=rows())
    assert trainer.evaluate()["eval_loss"] > 0
    assert not (tmp_path / "new").exists()


# ------------------------------------------------------------------------------------------ eval_strategy
def test_eval_strategy_without_eval_dataset_raises_like_upstream(tmp_path):
    transformers = pytest.importorskip("transformers")
    errors = []
    for lib in (trainwell, transformers):
        args = _args(lib, tmp_path, eval_strategy="steps", eval_steps=1, max_steps=2)
        with pytest.raises(ValueError) as info:
            lib.Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows())
        errors.append(str(info.value))
    # word for word, except that upstream prints the enum's repr ("IntervalStrategy.STEPS") where trainwell says "steps"
    assert errors[0] == errors[1].replace("IntervalStrategy.STEPS", "steps")
    assert "pass an `eval_dataset`" in errors[0]
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------ metric_for_best_model
@pytest.mark.parametrize("strategy", ["steps", "epoch"])
def test_missing_best_metric_saves_the_due_checkpoint_then_raises_naming_the_metrics(tmp_path, strategy):
    def compute_metrics(p):
        return {"mae": float(abs(p.predictions - p.label_ids).mean())}

    # steps: evaluate and save every 2 steps; epoch: 8 rows / batch 4 = 2 steps per epoch
    args = _args(trainwell, tmp_path, eval_strategy=strategy, eval_steps=2, save_strategy=strategy, save_steps=2,
                 max_steps=4, metric_for_best_model="f1", load_best_model_at_end=True)
    trainer = Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows(8), eval_dataset=rows(6),
                      compute_metrics=compute_metrics)
    with pytest.raises(KeyError) as info:
        trainer.train()
    message = str(info.value)
    assert "'eval_f1'" in message and "eval_mae" in message and "eval_loss" in message
    assert "checkpoint-2" in message
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and (checkpoint / "trainer_state.json").is_file()
    assert trainer.state.global_step == 2  # stopped at the first evaluation, after saving its checkpoint


@pytest.mark.slow  # over a second
def test_missing_best_metric_upstream_raises_the_same_key_error(tmp_path):
    transformers = pytest.importorskip("transformers")
    args = _args(transformers, tmp_path, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                 save_steps=2, max_steps=4, metric_for_best_model="f1", load_best_model_at_end=True)
    trainer = transformers.Trainer(model=SeededRegressor(DIM), args=args, train_dataset=rows(), eval_dataset=rows(6))
    with pytest.raises(KeyError, match="eval_f1"):
        trainer.train()
    assert not (tmp_path / "checkpoint-2").exists()  # upstream loses the step's checkpoint; trainwell saves it


# ------------------------------------------------------------------------------------------------ wrong types
def test_numeric_strings_are_converted_as_the_parser_does(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), learning_rate="1e-3", num_train_epochs="2",
                             per_device_train_batch_size="4", do_train="true", report_to="none")
    assert (args.learning_rate, args.num_train_epochs, args.per_device_train_batch_size, args.do_train) == \
        (1e-3, 2.0, 4, True)
    parsed = trainwell.HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--learning_rate", "1e-3", "--num_train_epochs", "2",
         "--per_device_train_batch_size", "4", "--do_train", "--report_to", "none"])[0]
    assert (parsed.learning_rate, parsed.num_train_epochs, parsed.per_device_train_batch_size, parsed.do_train) == \
        (args.learning_rate, args.num_train_epochs, args.per_device_train_batch_size, args.do_train)
    # and the converted value really trains (upstream: "TypeError: '<' not supported" deep inside)
    trainer = Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, learning_rate="1e-3", max_steps="2"),
                      train_dataset=rows())
    assert trainer.train().global_step == 2


@pytest.mark.parametrize("field, value, kind", [("learning_rate", "fast", "float"),
                                                ("per_device_train_batch_size", 2.5, "int"),
                                                ("num_train_epochs", None, "float"), ("do_train", "maybe", "bool")])
def test_values_of_the_wrong_type_name_the_field(tmp_path, field, value, kind):
    with pytest.raises(TypeError, match=rf"TrainingArguments\.{field} must be {kind}, got"):
        TrainingArguments(output_dir=str(tmp_path), **{field: value})


def test_args_given_as_a_dict_says_how_to_wrap_it(tmp_path):
    with pytest.raises(TypeError, match=r"got a dict; wrap it: `Trainer\(args=TrainingArguments\(\*\*d\)\)`"):
        Trainer(model=SeededRegressor(DIM), args={"output_dir": str(tmp_path), "max_steps": 2}, train_dataset=rows())
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------------------------- dataset types
def test_dataframe_says_how_to_wrap_it(tmp_path):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"x": [[0.0, 1.0, 2.0]] * 4, "labels": [1.0, 2.0, 3.0, 4.0]})
    with pytest.raises(TypeError, match=r"train_dataset is a pandas DataFrame.*Dataset\.from_pandas\(df\)"):
        Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=2), train_dataset=df)
    with pytest.raises(TypeError, match=r"eval_dataset is a pandas DataFrame"):
        Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path), eval_dataset={"a": df})
    trainer = Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path))
    for call in (trainer.evaluate, trainer.predict):  # a dataset passed to the method is checked too
        with pytest.raises(TypeError, match=r"(eval|test)_dataset is a pandas DataFrame"):
            call(df)


def test_dataframe_wrapped_as_the_message_says_trains(tmp_path):
    pd = pytest.importorskip("pandas")
    datasets = pytest.importorskip("datasets")
    data = rows()
    df = pd.DataFrame({"x": [r["x"].tolist() for r in data], "labels": [float(r["labels"]) for r in data]})
    dataset = datasets.Dataset.from_pandas(df).with_format("torch")
    trainer = Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=2), train_dataset=dataset)
    assert trainer.train().global_step == 2


def test_plain_generator_says_how_to_wrap_it_and_the_wrapped_stream_trains_with_max_steps(tmp_path):
    def examples():
        yield from rows()

    with pytest.raises(TypeError, match=r"(?s)train_dataset is a generator.*IterableDataset.*max_steps"):
        Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=2), train_dataset=examples())

    class Stream(torch.utils.data.IterableDataset):  # the wrapping the message shows
        def __iter__(self):
            return examples()

    trainer = Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=5), train_dataset=Stream())
    out = trainer.train()
    assert out.global_step == 5  # 10 rows / batch 4 = 3 batches per pass: the stream is re-created each pass
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_a_dict_as_train_dataset_says_how_to_wrap_it(tmp_path):
    with pytest.raises(TypeError, match=r"train_dataset is a dict.*Dataset\.from_dict\(d\)"):
        Trainer(model=SeededRegressor(DIM), args=_args(trainwell, tmp_path, max_steps=2),
                train_dataset={"x": [[0.0] * 3], "labels": [1.0]})


def test_a_subclass_with_untyped_none_defaults_still_works_and_names_its_own_class(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class ScriptArguments(TrainingArguments):  # the pattern of many example scripts
        max_train_samples: int = None
        temperature: float = 1.0

    args = ScriptArguments(output_dir=str(tmp_path), temperature="0.5")
    assert args.max_train_samples is None and args.temperature == 0.5
    with pytest.raises(TypeError, match=r"ScriptArguments\.temperature must be float, got str 'hot'"):
        ScriptArguments(output_dir=str(tmp_path), temperature="hot")
