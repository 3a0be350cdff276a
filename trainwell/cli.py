"""The ``trainwell`` command.

``trainwell train`` trains the built-in recipe; ``trainwell train CONFIG.yaml [--flag value ...]`` trains a user
recipe (see :mod:`trainwell.recipes.config`), any ``TrainingArguments`` field being a flag that overrides the file.

Subcommands are registered with :func:`add_subcommand`; each one receives the raw arguments after its name, so it
may parse them as it likes (``train`` hands them to the ``TrainingArguments`` parser). Errors a user can fix (bad
file, bad import path, unknown flag, invalid argument combination) print one ``trainwell: error: ...`` message and
return exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Sequence

PROG = "trainwell"


class CLIError(Exception):
    """A usage error: printed as one ``trainwell: error:`` message, exit status 2."""


@dataclass(frozen=True)
class Subcommand:
    """A ``trainwell <name>`` command: ``run(argv_after_name) -> exit status``."""

    name: str
    help: str
    run: Callable[[list[str]], int]


_SUBCOMMANDS: dict[str, Subcommand] = {}


def add_subcommand(name: str, help: str, run: Callable[[list[str]], int]) -> None:
    """Register ``trainwell <name>``; ``run`` gets the arguments after the name and returns the exit status.

    ``run`` handles its own ``--help`` and may raise :class:`CLIError` (or ``RecipeError``) for usage errors.
    """
    _SUBCOMMANDS[name] = Subcommand(name, help, run)


def build_top_parser() -> argparse.ArgumentParser:
    """The parser behind ``trainwell --help`` (it lists the registered subcommands)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="trainwell: train PyTorch models with the familiar Trainer / TrainingArguments API.",
        epilog="Run 'trainwell <command> --help' for the options of a command. "
        "Start with 'trainwell train': it trains a small built-in model in about a minute on a CPU.",
    )
    parser.add_argument("--version", action="store_true", help="print the trainwell version and exit")
    commands = parser.add_subparsers(title="commands", metavar="<command>")
    for sub in _SUBCOMMANDS.values():
        commands.add_parser(sub.name, help=sub.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trainwell`` command; returns the exit status (0 success, 2 usage error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        build_top_parser().print_help()
        return 0 if argv else 2
    if argv[0] == "--version":
        from . import __version__

        print(f"{PROG} {__version__}")
        return 0
    command = _SUBCOMMANDS.get(argv[0])
    try:
        if command is None:
            raise CLIError(_unknown_command_message(argv[0]))
        return command.run(argv[1:])
    except SystemExit as exc:  # argparse inside a subcommand (e.g. its --help)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except Exception as exc:
        if not _is_usage_error(exc):
            raise
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


def _unknown_command_message(name: str) -> str:
    close = difflib.get_close_matches(name, list(_SUBCOMMANDS), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"choose from {', '.join(_SUBCOMMANDS)}"
    return f"unknown command {name!r}; {hint} (see 'trainwell --help')"


def _is_usage_error(exc: BaseException) -> bool:
    from .recipes.config import RecipeError

    return isinstance(exc, (CLIError, RecipeError))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ------------------------------------------------------------------------------------------------ train

TRAIN_HELP = """\
usage: trainwell train [CONFIG.yaml] [--training_argument VALUE ...]

Train a model with trainwell's Trainer.

  trainwell train
      Train the built-in recipe: a small character-level transformer language model on the text of Python's
      own standard-library docstrings (no download, no extra package). Progress bar, evaluation every
      200 steps, checkpoints in ./trainwell-output, a summary table at the end; about a minute on 2 CPU cores.

  trainwell train CONFIG.yaml
      Train your own recipe, described by a YAML file (CONFIG must come first):

        model:                                  # called as factory(**kwargs)
          factory: my_recipe:build_model        # package.module:function
          kwargs: {hidden: 128}
        train_dataset: {factory: my_recipe:build_dataset, kwargs: {split: train}}
        eval_dataset:  {factory: my_recipe:build_dataset, kwargs: {split: eval}}     # optional
        # or one factory returning (train, eval):  datasets: {factory: my_recipe:build_datasets}
        data_collator: my_recipe:collate        # optional: the callable itself, or {factory:, kwargs:}
        compute_metrics: my_recipe:metrics      # optional: same
        args:                                   # any TrainingArguments field
          output_dir: out
          num_train_epochs: 3

      The YAML file's folder is on the import path, so a my_recipe.py next to it is found.

Every TrainingArguments field is also a flag (--max_steps 100, --output_dir runs/x, --learning_rate 1e-3,
--eval_strategy no, --resume_from_checkpoint last ...); flags override the YAML file and the built-in recipe's
defaults. Booleans take --flag / --flag false / --no_flag.

training arguments (defaults shown are the built-in recipe's):
"""


def _training_arguments_help() -> str:
    """The option list of the ``TrainingArguments`` parser, with the built-in recipe's values as defaults."""
    from .recipes import DEFAULT_RECIPE_ARGS

    parser = _training_args_parser()
    _apply_defaults(parser, DEFAULT_RECIPE_ARGS)
    formatter = parser._get_formatter()
    formatter._indent()
    for group in parser._action_groups:
        formatter.add_arguments([a for a in group._group_actions if a.dest != "help"])
    return formatter.format_help()


def _training_args_parser() -> Any:
    """An ``ArgParser`` over ``TrainingArguments`` whose errors raise :class:`CLIError` instead of exiting."""
    from .args import TrainingArguments
    from .parser import ArgParser

    class _Parser(ArgParser):
        def error(self, message: str) -> Any:  # argparse would print the huge usage text and exit
            raise CLIError(message)

    return _Parser(TrainingArguments, prog="trainwell train", add_help=False)


def _apply_defaults(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """Make the recipe's values the defaults that command-line flags override."""
    for action in parser._actions:
        if action.dest in defaults:
            action.default = defaults[action.dest]
            action.required = False


def parse_training_args(defaults: dict[str, Any], flags: Sequence[str]) -> Any:
    """``TrainingArguments`` from ``defaults`` (the recipe's ``args``) overridden by command-line ``flags``."""
    parser = _training_args_parser()
    valid = {a.dest for a in parser._actions}
    for key in sorted(set(defaults) - valid):
        close = difflib.get_close_matches(str(key), sorted(valid), n=1)
        hint = f"did you mean {close[0]!r}?" if close else "see 'trainwell train --help' for the valid names"
        raise CLIError(f"recipe 'args': {key!r} is not a TrainingArguments field; {hint}")
    _apply_defaults(parser, defaults)
    try:
        *outputs, remaining = parser.parse_args_into_dataclasses(
            args=list(flags), return_remaining_strings=True, look_for_args_file=False
        )
    except (ValueError, NotImplementedError, TypeError) as exc:
        raise CLIError(f"invalid training arguments: {_one_line(exc)}") from None
    if any(r.endswith((".yaml", ".yml")) for r in remaining):
        raise CLIError("the recipe file must come right after 'train': trainwell train CONFIG.yaml [--flags]")
    if remaining:
        flags_only = [r for r in remaining if r.startswith("-")] or remaining  # skip the values of bad flags
        raise CLIError("; ".join(parser._unknown_args_message(flags_only).splitlines()))
    return outputs[0]


def _split_config(argv: list[str]) -> tuple[str | None, list[str]]:
    """``[CONFIG.yaml] flags...`` -> (config path or None, flags)."""
    if argv and not argv[0].startswith("-"):
        return argv[0], argv[1:]
    return None, argv


def run_train(argv: list[str]) -> int:
    """``trainwell train [CONFIG.yaml] [--flags]``: build the recipe, train, evaluate, save, print a summary."""
    if any(a in ("-h", "--help") for a in argv):
        print(TRAIN_HELP + _training_arguments_help())
        return 0
    from .recipes import default_recipe, load_recipe

    config, flags = _split_config(argv)
    recipe = load_recipe(config) if config else default_recipe()
    args = parse_training_args(recipe.args, flags)
    return run_recipe(recipe, args)


def _resume_value(args: Any) -> str | bool | None:
    """``--resume_from_checkpoint last`` (or true) resumes from the newest checkpoint in ``output_dir``."""
    value = getattr(args, "resume_from_checkpoint", None)
    if isinstance(value, str) and value.lower() in ("last", "true", "latest"):
        return True
    return value or None


def run_recipe(recipe: Any, args: Any) -> int:
    """Seed, build the recipe, train, evaluate, save the model, metrics and state, and print the summary."""
    from . import Trainer
    from .trainer_utils import set_seed

    set_seed(args.seed)  # before building, so the model's initial weights follow --seed
    components = recipe.build()
    if components.train_dataset is None:
        raise CLIError(f"recipe {recipe.name}: no training dataset; add 'train_dataset' (or 'datasets') to it")
    trainer = Trainer(args=args, **components.trainer_kwargs())
    result = trainer.train(resume_from_checkpoint=_resume_value(args))
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    eval_metrics: dict[str, Any] = {}
    if components.eval_dataset is not None:
        eval_metrics = _last_eval_metrics(trainer) or trainer.evaluate()
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)
    trainer.save_model()
    trainer.save_state()
    extra = recipe.finish(components, trainer) if recipe.finish else []
    if trainer.is_world_process_zero():
        print(format_summary(recipe, args, result, eval_metrics, extra))
    return 0


def _last_eval_metrics(trainer: Any) -> dict[str, Any]:
    """The metrics of an evaluation already run at the final step (so it is not repeated), else {}."""
    history = trainer.state.log_history
    for entry in reversed(history):
        if "eval_loss" in entry:
            if entry.get("step") == trainer.state.global_step:
                return {k: v for k, v in entry.items() if k.startswith("eval_") or k == "epoch"}
            break
    return {}


_EVAL_SPEED_KEYS = ("eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "epoch")


def summary_rows(recipe: Any, args: Any, result: Any, eval_metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``(label, value)`` rows of the end-of-run summary."""
    import math

    from .trainer_utils import get_last_checkpoint

    metrics = result.metrics
    rows = [("recipe", recipe.name), ("steps", str(result.global_step)),
            ("train loss", f"{result.training_loss:.4f}")]
    if "eval_loss" in eval_metrics:
        loss = float(eval_metrics["eval_loss"])
        rows.append(("eval loss", f"{loss:.4f}"))
        if recipe.language_model:
            rows.append(("perplexity", f"{math.exp(min(loss, 700.0)):.2f}"))
    for key, value in eval_metrics.items():  # the recipe's own metrics (accuracy, ...)
        if key not in _EVAL_SPEED_KEYS and isinstance(value, (int, float)):
            rows.append((key.removeprefix("eval_").replace("_", " "), f"{value:.4f}"))
    rows += [
        ("runtime", f"{metrics.get('train_runtime', float('nan')):.1f} s"),
        ("samples/s", f"{metrics.get('train_samples_per_second', float('nan')):.1f}"),
        ("checkpoint", get_last_checkpoint(args.output_dir) or "none"),
        ("model saved to", str(args.output_dir)),
    ]
    return rows


def format_summary(recipe: Any, args: Any, result: Any, eval_metrics: dict[str, Any],
                   extra: Sequence[tuple[str, str]] = ()) -> str:
    """A boxed two-column table of :func:`summary_rows` plus the recipe's ``extra`` rows."""
    rows = [(label, " ".join(value.split())) for label, value in summary_rows(recipe, args, result, eval_metrics)
            + list(extra)]  # one line per value: a generated sample may hold newlines and tabs
    width = max(len(label) for label, _ in rows)
    value_width = min(100, max(len(value) for _, value in rows))
    rule = "+" + "-" * (width + 2) + "+" + "-" * (value_width + 2) + "+"
    lines = [rule, f"| {'trainwell train: summary'.ljust(width + value_width + 3)} |", rule]
    for label, value in rows:
        chunks = textwrap.wrap(value, value_width, drop_whitespace=False) or [""]
        for i, chunk in enumerate(chunks):
            lines.append(f"| {(label if i == 0 else '').ljust(width)} | {chunk.ljust(value_width)} |")
    lines.append(rule)
    return "\n".join(lines)


add_subcommand("train", "train the built-in recipe or a YAML recipe (any TrainingArguments flag works)", run_train)


def _run_zero_to_fp32(argv: list[str]) -> int:
    from .zero import cmd_zero_to_fp32

    return cmd_zero_to_fp32(argv)


def _run_estimate_memory(argv: list[str]) -> int:
    from .zero import cmd_estimate_memory

    return cmd_estimate_memory(argv)


add_subcommand("zero-to-fp32", "consolidate a DeepSpeed ZeRO checkpoint into one fp32 weights file",
               _run_zero_to_fp32)
add_subcommand("estimate-memory", "ZeRO-2/3 memory needs: --params N [--gpus G --nodes K]", _run_estimate_memory)


if __name__ == "__main__":
    sys.exit(main())
