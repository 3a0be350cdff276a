"""The ``trainwell`` command: help, the built-in recipe, YAML recipes with flag overrides, and usage errors."""

from __future__ import annotations

import json
import re
import sys
import textwrap

import pytest

from trainwell.cli.main import CLIError, add_subcommand, main, parse_training_args
from helpers.launch import ROOT

EXAMPLES = ROOT / "examples"

RECIPE_MODULE = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, width=4):
        super().__init__()
        self.layer = nn.Linear(width, 2)

    def forward(self, x, labels=None):
        logits = self.layer(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


def build_model(width=4):
    return Tiny(width)


def build_data(n=64, width=4):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, width, generator=g)
    items = [{"x": x[i], "labels": torch.tensor(int(x[i, 0] > 0))} for i in range(n)]
    return items[: n - 16], items[n - 16 :]
'''


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch):
    """A folder with a factory module and a YAML recipe naming it (the folder goes on sys.path)."""
    (tmp_path / "cli_recipe_mod.py").write_text(RECIPE_MODULE)
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent(f"""
        model: {{factory: cli_recipe_mod:build_model, kwargs: {{width: 4}}}}
        datasets: {{factory: cli_recipe_mod:build_data, kwargs: {{n: 64}}}}
        args:
          output_dir: {tmp_path / 'out'}
          max_steps: 6
          learning_rate: 0.05
          per_device_train_batch_size: 8
          eval_strategy: steps
          eval_steps: 2
          report_to: none
          disable_tqdm: true
    """))
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("cli_recipe_mod", None)


def test_top_help(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "usage: trainwell" in out
    assert main([]) == 2  # no command: the help, and a usage-error status


def test_train_help_explains_recipe_and_flags(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "factory: my_recipe:build_model" in out and "CONFIG.yaml" in out
    assert "--max_steps" in out and "--learning_rate" in out  # every TrainingArguments flag is listed
    assert "(default: trainwell-output)" in out  # the built-in recipe's defaults


def test_unknown_command(capsys):
    assert main(["trian"]) == 2
    assert "did you mean 'train'?" in capsys.readouterr().err


def test_a_subcommand_usage_error_gives_the_help_hint_once(capsys):
    assert main(["plot"]) == 2  # its output_dir is required: argparse reports it through error() twice
    assert capsys.readouterr().err.count("(see 'trainwell plot --help')") == 1
    assert main(["estimate-memory", "--params", "x"]) == 2
    assert capsys.readouterr().err.count("(see 'trainwell estimate-memory --help')") == 1


def test_add_subcommand_dispatches(capsys):
    seen = []
    add_subcommand("echo-test", "test only", lambda argv: seen.append(argv) or 0)
    try:
        assert main(["echo-test", "a", "--b"]) == 0
        assert seen == [["a", "--b"]]
        main(["--help"])
        assert "echo-test" in capsys.readouterr().out
    finally:
        from trainwell.cli import main as cli_main

        cli_main._SUBCOMMANDS.pop("echo-test")


def test_default_recipe_tiny_run(tmp_path, capsys):
    out_dir = tmp_path / "run"
    code = main(["train", "--max_steps", "3", "--output_dir", str(out_dir), "--eval_steps", "2",
                 "--logging_steps", "1", "--disable_tqdm", "true", "--per_device_train_batch_size", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert (out_dir / "checkpoint-3" / "trainer_state.json").is_file()  # saved at the end of training
    assert (out_dir / "vocab.json").is_file() and any(out_dir.glob("model*.safetensors"))
    assert "trainwell train: summary" in out
    for label in ("  steps ", "  eval loss ", "  perplexity ", "  checkpoint ", "\nsample (after"):
        assert label in out
    assert "checkpoint-3" in out
    state = json.loads((out_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [2, 3]


def test_yaml_recipe_flag_overrides_file(recipe_dir, capsys):
    out_dir = recipe_dir / "override"
    code = main(["train", str(recipe_dir / "recipe.yaml"), "--max_steps", "4", "--output_dir", str(out_dir)])
    assert code == 0
    state = json.loads((out_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 4  # the flag beat the file's max_steps: 6
    logged_lr = [e for e in state["log_history"] if "learning_rate" in e]
    assert re.search(r"^  steps +4$", capsys.readouterr().out, re.M)
    assert not (recipe_dir / "out").exists()  # the file's output_dir was overridden too
    assert logged_lr == [] or max(e["learning_rate"] for e in logged_lr) <= 0.05


def test_parse_training_args_precedence():
    args = parse_training_args({"max_steps": 5, "learning_rate": 0.1, "output_dir": "x"}, ["--max_steps", "2"])
    assert (args.max_steps, args.learning_rate, args.output_dir) == (2, 0.1, "x")
    with pytest.raises(CLIError, match="'max_stepz' is not a TrainingArguments field; did you mean 'max_steps'"):
        parse_training_args({"max_stepz": 5}, [])


def _error_of(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("trainwell: error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_bad_import_path_exits_2(recipe_dir, capsys):
    path = recipe_dir / "bad.yaml"
    path.write_text("model: {factory: no_such_module_abc:build}\ntrain_dataset: {factory: cli_recipe_mod:build_data}\n")
    err = _error_of(["train", str(path)], capsys)
    assert "key 'model'" in err and "cannot import module 'no_such_module_abc'" in err and "bad.yaml" in err
    path.write_text("model: {factory: cli_recipe_mod:nope}\n")
    assert "module 'cli_recipe_mod' has no attribute 'nope'" in _error_of(["train", str(path)], capsys)


def test_usage_errors_exit_2(recipe_dir, tmp_path, capsys):
    assert "did you mean --max_steps?" in _error_of(["train", "--max_stepz", "3"], capsys)
    assert "does not exist" in _error_of(["train", str(tmp_path / "missing.yaml")], capsys)
    assert "invalid int value" in _error_of(["train", "--max_steps", "many"], capsys)
    assert "fp16" in _error_of(["train", "--fp16", "--bf16", "--output_dir", str(tmp_path)], capsys)
    assert "must come right after 'train'" in _error_of(["train", "--max_steps", "2", "r.yaml"], capsys)


def test_example_recipe_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    out_dir = tmp_path / "digits"
    code = main(["train", str(EXAMPLES / "recipe.yaml"), "--max_steps", "4", "--output_dir", str(out_dir),
                 "--eval_strategy", "steps", "--eval_steps", "4", "--save_strategy", "no", "--disable_tqdm", "true"])
    sys.modules.pop("my_recipe", None)
    assert code == 0
    metrics = json.loads((out_dir / "eval_results.json").read_text())
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and metrics["eval_loss"] > 0
    assert not list(out_dir.glob("checkpoint-*"))  # --save_strategy no overrode the file's epoch
    out = capsys.readouterr().out
    assert "  accuracy " in out and "perplexity" not in out  # recipe metrics shown; perplexity only for LMs


def test_resume_value_last_means_newest_checkpoint(tmp_path):
    from types import SimpleNamespace

    from trainwell.cli.main import CLIError, _resume_value

    (tmp_path / "checkpoint-5").mkdir()
    out = str(tmp_path)
    assert _resume_value(SimpleNamespace(resume_from_checkpoint="last", output_dir=out)) is True
    path = str(tmp_path / "checkpoint-5")
    assert _resume_value(SimpleNamespace(resume_from_checkpoint=path, output_dir=out)) == path
    assert _resume_value(SimpleNamespace(resume_from_checkpoint=None, output_dir=out)) is None
    assert _resume_value(SimpleNamespace(resume_from_checkpoint="auto", output_dir=out)) == "auto"
    with pytest.raises(CLIError, match="auto"):
        _resume_value(SimpleNamespace(resume_from_checkpoint="last", output_dir=str(tmp_path / "empty")))
