"""Tests for trainwell.args.parser: dataclasses <-> argparse / dict / json / yaml."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import List, Literal, Optional, Union

import pytest

from trainwell.args.parser import ArgParser, HfArgumentParser, string_to_bool
from helpers.launch import ROOT


class Color(str, Enum):
    RED = "red"
    BLUE = "blue"


class IntervalLike(str, Enum):
    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


@dataclass
class Basic:
    name: str = field(metadata={"help": "The run name (100% yours)."})
    lr: float = field(default=1e-3, metadata={"help": "Learning rate.", "aliases": ["--learning-rate-alias"]})
    steps: int = 10
    use_cache: bool = field(default=True, metadata={"help": "Keep the cache."})
    verbose: bool = False
    maybe: Optional[bool] = None
    color: Color = Color.RED
    mode: Literal["fast", "slow", 3] = "fast"
    tags: List[str] = field(default_factory=lambda: ["a"])
    ints: list[int] = field(default_factory=list)
    every: Union[float, int] = 500
    cfg: Optional[Union[dict, str]] = None
    report: Union[None, str, List[str]] = None
    seed: Optional[int] = None
    hidden: int = field(default=7, init=False)

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"steps must be >= 0, got {self.steps}")
        self.color = Color(self.color)


@dataclass
class Model:
    model_name: str = "tiny"
    depth: int = 2
    width: int | None = None


def test_alias():
    assert HfArgumentParser is ArgParser


def test_defaults_and_types():
    (b,) = ArgParser(Basic).parse_args_into_dataclasses(["--name", "x"], look_for_args_file=False)
    assert (b.name, b.lr, b.steps, b.use_cache, b.verbose, b.maybe) == ("x", 1e-3, 10, True, False, None)
    assert b.color is Color.RED and b.mode == "fast" and b.tags == ["a"] and b.ints == [] and b.hidden == 7
    assert b.every == 500 and b.cfg is None and b.seed is None


def test_values_parsed():
    argv = ["--name", "x", "--lr", "0.5", "--steps", "3", "--verbose", "--maybe", "NO", "--color", "blue",
            "--mode", "3", "--tags", "p", "q", "--ints", "1", "2", "--every", "0.1", "--cfg", '{"a": 1}',
            "--report", "none", "--seed", "4"]
    (b,) = ArgParser(Basic).parse_args_into_dataclasses(argv, look_for_args_file=False)
    assert b.lr == 0.5 and b.steps == 3 and b.verbose is True and b.maybe is False
    assert b.color is Color.BLUE and b.mode == 3 and b.tags == ["p", "q"] and b.ints == [1, 2]
    assert b.every == 0.1 and isinstance(b.every, float)
    assert b.cfg == '{"a": 1}' and b.report == "none" and b.seed == 4


def test_int_or_float_keeps_integers_and_multi_report():
    (b,) = ArgParser(Basic).parse_args_into_dataclasses(
        ["--name", "x", "--every", "25", "--report", "tb", "wandb"], look_for_args_file=False)
    assert b.every == 25 and isinstance(b.every, int)
    assert b.report == ["tb", "wandb"]


@pytest.mark.parametrize("text,expected", [("true", True), ("False", False), ("YES", True), ("no", False),
                                           ("1", True), ("0", False)])
def test_bool_values(text, expected):
    (b,) = ArgParser(Basic).parse_args_into_dataclasses(["--name", "x", "--use_cache", text],
                                                        look_for_args_file=False)
    assert b.use_cache is expected
    assert string_to_bool(text) is expected


def test_no_flag_and_dash_forms_and_aliases():
    parser = ArgParser(Basic)
    (b,) = parser.parse_args_into_dataclasses(["--name", "x", "--no_use_cache"], look_for_args_file=False)
    assert b.use_cache is False
    (b,) = parser.parse_args_into_dataclasses(["--name", "x", "--no-use-cache", "--learning-rate-alias", "2"],
                                              look_for_args_file=False)
    assert b.use_cache is False and b.lr == 2.0
    (b,) = parser.parse_args_into_dataclasses(["--name=y", "--use-cache", "false"], look_for_args_file=False)
    assert b.name == "y" and b.use_cache is False
    option_strings = {o for a in parser._actions for o in a.option_strings}
    assert "--no_verbose" not in option_strings  # only True-defaulting bools get a --no_ form
    assert "--hidden" not in option_strings  # init=False fields are not exposed


def test_bad_bool_and_enum_choice_exit_2(capsys):
    parser = ArgParser(Basic)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_into_dataclasses(["--name", "x", "--color", "green"], look_for_args_file=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--color" in err and "green" in err and "'red'" in err and "'blue'" in err
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--name", "x", "--verbose", "maybe"], look_for_args_file=False)
    assert "expected a boolean" in capsys.readouterr().err


def test_required_field_missing(capsys):
    with pytest.raises(SystemExit) as exc:
        ArgParser(Basic).parse_args_into_dataclasses([], look_for_args_file=False)
    assert exc.value.code == 2
    assert "--name" in capsys.readouterr().err


def test_post_init_validation_surfaces():
    with pytest.raises(ValueError, match="steps must be >= 0"):
        ArgParser(Basic).parse_args_into_dataclasses(["--name", "x", "--steps", "-1"], look_for_args_file=False)


def test_unknown_flag_suggests_closest(capsys):
    with pytest.raises(SystemExit) as exc:
        ArgParser(Basic).parse_args_into_dataclasses(["--name", "x", "--stepz", "3"], look_for_args_file=False)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown argument --stepz; did you mean --steps?" in err
    assert "unexpected value '3'" in err


def test_abbreviations_are_not_guessed(capsys):
    with pytest.raises(SystemExit):
        ArgParser(Basic).parse_args_into_dataclasses(["--name", "x", "--verb"], look_for_args_file=False)
    assert "did you mean --verbose?" in capsys.readouterr().err


def test_multiple_dataclasses_and_remaining():
    parser = ArgParser([Model, Basic])
    model, basic, rest = parser.parse_args_into_dataclasses(
        ["--depth", "4", "--name", "n", "--extra", "1", "--width", "8"], return_remaining_strings=True,
        look_for_args_file=False)
    assert isinstance(model, Model) and model.depth == 4 and model.model_name == "tiny" and model.width == 8
    assert isinstance(basic, Basic) and basic.name == "n"
    assert rest == ["--extra", "1"]


def test_extra_add_argument_returns_namespace():
    parser = ArgParser(Model)
    parser.add_argument("--custom", type=int, default=0)
    model, ns = parser.parse_args_into_dataclasses(["--custom", "5"], look_for_args_file=False)
    assert model.depth == 2 and ns.custom == 5


def test_help_lists_field_help(capsys):
    with pytest.raises(SystemExit) as exc:
        ArgParser(Basic).parse_args_into_dataclasses(["--help"], look_for_args_file=False)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "The run name (100% yours)." in out and "Learning rate." in out and "--no_use_cache" in out
    assert "default: 0.001" in out


def test_args_files(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    (tmp_path / "train.args").write_text("--name from_file --steps 5  # a comment\n")
    monkeypatch.setattr(sys, "argv", [str(script), "--steps", "6"])
    (b,) = ArgParser(Basic).parse_args_into_dataclasses()
    assert b.name == "from_file" and b.steps == 6  # the command line wins over the file
    extra = tmp_path / "more.txt"
    extra.write_text("--lr 0.25\n--tags 'a b' c")
    (b,) = ArgParser(Basic).parse_args_into_dataclasses(
        ["--args_file", str(extra), "--name", "z"], look_for_args_file=False, args_file_flag="--args_file")
    assert b.lr == 0.25 and b.tags == ["a b", "c"] and b.name == "z"
    (b,) = ArgParser(Basic).parse_args_into_dataclasses(["--name", "q"], args_filename=extra)
    assert b.lr == 0.25 and b.name == "q"
    with pytest.raises(FileNotFoundError, match="nope.args"):
        ArgParser(Basic).parse_args_into_dataclasses([], args_filename=tmp_path / "nope.args")


def test_parse_dict_and_extra_keys():
    parser = ArgParser([Model, Basic])
    model, basic = parser.parse_dict({"name": "d", "depth": 3, "color": "blue", "every": 0.5})
    assert model.depth == 3 and basic.color is Color.BLUE and basic.every == 0.5
    with pytest.raises(ValueError) as exc:
        parser.parse_dict({"name": "d", "detph": 1})
    assert "'detph'" in str(exc.value) and "did you mean 'depth'" in str(exc.value)
    model, basic = parser.parse_dict({"name": "d", "detph": 1}, allow_extra_keys=True)
    assert model.depth == 2


def test_parse_json_and_yaml(tmp_path):
    parser = ArgParser(Basic)
    jf = tmp_path / "a.json"
    jf.write_text(json.dumps({"name": "j", "steps": 2, "tags": ["x"]}))
    (b,) = parser.parse_json_file(jf)
    assert (b.name, b.steps, b.tags) == ("j", 2, ["x"])
    yf = tmp_path / "a.yaml"
    yf.write_text("name: y\nuse_cache: false\ncolor: blue\n")
    (b,) = parser.parse_yaml_file(str(yf))
    assert b.name == "y" and b.use_cache is False and b.color is Color.BLUE
    yf.write_text("name: y\nlrr: 1\n")
    with pytest.raises(ValueError, match="did you mean 'lr'"):
        parser.parse_yaml_file(yf)
    yf.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        parser.parse_yaml_file(yf)
    bad = [(yf, "name: [y\n", r"(?s)a.yaml' is not valid yaml .*; fix the file"),
           (jf, "[1, 2]", "a.json' must hold a mapping of field names to values, got list"),
           (jf, '{"name": ', r"(?s)a.json' is not valid json .*; fix the file")]
    for path, text, message in bad:
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            (parser.parse_json_file if path.suffix == ".json" else parser.parse_yaml_file)(path)


def test_rejects_non_dataclass_and_unsupported_union():
    with pytest.raises(TypeError, match="dataclass"):
        ArgParser([int])

    @dataclass
    class Bad:
        x: Union[int, List[int]] = 1

    with pytest.raises(ValueError, match="'x'"):
        ArgParser(Bad)


def test_training_arguments():
    args_mod = pytest.importorskip("trainwell.args.fields")
    parser = ArgParser(args_mod.TrainingArguments)
    (ta,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "x", "--num_train_epochs", "2", "--fp16", "false", "--eval_strategy", "steps",
         "--eval_steps", "5", "--report_to", "none"], look_for_args_file=False)
    assert ta.output_dir == "x" and ta.num_train_epochs == 2 and ta.fp16 is False
    assert ta.eval_strategy == "steps" and ta.eval_steps == 5
    assert ta.report_to in ([], "none", ["none"])
    assert dataclasses.is_dataclass(ta)


def test_training_arguments_help_and_typo(capsys):
    args_mod = pytest.importorskip("trainwell.args.fields")
    parser = ArgParser(args_mod.TrainingArguments)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_into_dataclasses(["--help"], look_for_args_file=False)
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--learning_rate" in out and "--per_device_train_batch_size" in out and "--eval_strategy" in out
    with pytest.raises(SystemExit) as exc:
        parser.parse_args_into_dataclasses(["--output_dir", "x", "--learning_rat", "1"], look_for_args_file=False)
    assert exc.value.code == 2
    assert "unknown argument --learning_rat; did you mean --learning_rate?" in capsys.readouterr().err


@dataclass
class MiniTrainingArguments:
    """Mimics the field types of upstream TrainingArguments."""

    output_dir: Optional[str] = field(default=None, metadata={"help": "Where to write checkpoints."})
    num_train_epochs: float = 3.0
    fp16: bool = False
    eval_strategy: Union[IntervalLike, str] = "no"
    eval_steps: Optional[float] = None
    logging_steps: float = 500
    report_to: Union[None, str, list[str]] = None
    lr_scheduler_kwargs: Union[dict, str] = field(default_factory=dict)
    fsdp: Optional[Union[list[IntervalLike], str]] = ""
    save_safetensors: Optional[bool] = True

    def __post_init__(self) -> None:
        self.eval_strategy = IntervalLike(self.eval_strategy)
        if isinstance(self.lr_scheduler_kwargs, str):
            self.lr_scheduler_kwargs = json.loads(self.lr_scheduler_kwargs)


def test_training_arguments_like_dataclass(capsys):
    parser = ArgParser(MiniTrainingArguments)
    (ta,) = parser.parse_args_into_dataclasses(
        ["--output_dir", "x", "--num_train_epochs", "2", "--fp16", "false", "--eval_strategy", "steps",
         "--eval_steps", "5", "--report_to", "none", "--lr_scheduler_kwargs", '{"power": 2}', "--no_save_safetensors"],
        look_for_args_file=False)
    assert ta.output_dir == "x" and ta.num_train_epochs == 2.0 and ta.fp16 is False
    assert ta.eval_strategy is IntervalLike.STEPS and ta.eval_steps == 5.0 and ta.report_to == "none"
    assert ta.lr_scheduler_kwargs == {"power": 2} and ta.save_safetensors is False and ta.fsdp == ""
    with pytest.raises(SystemExit):
        parser.parse_args_into_dataclasses(["--eval_strategy", "sometimes"], look_for_args_file=False)
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


@pytest.mark.slow
def test_import_is_light():
    source = ROOT / "trainwell" / "args" / "parser.py"
    code = f"import runpy, sys; runpy.run_path({str(source)!r}); print('torch' in sys.modules, 'yaml' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]



@dataclass
class _Offset:
    offset: float = 0.0


@pytest.mark.parametrize("text, value", [("-1e-3", -1e-3), ("-1.5E+2", -150.0), ("-.5", -0.5), ("-2", -2.0)])
def test_a_negative_number_in_any_form_is_a_value_not_an_option(text: str, value: float) -> None:
    """argparse's own rule reads ``-1e-3`` as an option and says the option before it "expected one argument"; the
    parser reads every form of a negative number as the value."""
    (parsed,) = HfArgumentParser(_Offset).parse_args_into_dataclasses(["--offset", text])
    assert parsed.offset == value


def test_a_negative_learning_rate_in_exponent_form_gets_the_arguments_own_message() -> None:
    from trainwell import TrainingArguments

    with pytest.raises(ValueError, match="learning_rate") as raised:
        HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            ["--output_dir", "o", "--learning_rate", "-1e-3", "--report_to", "none"])
    assert "-0.001" in str(raised.value)
