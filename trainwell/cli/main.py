"""The ``trainwell`` command.

``trainwell train`` trains the built-in recipe; ``trainwell train CONFIG.yaml [--flag value ...]`` trains a user
recipe (see :mod:`trainwell.cli.recipes.config`), any ``TrainingArguments`` field being a flag that overrides the file.

Subcommands are registered with :func:`add_subcommand`; each one receives the raw arguments after its name, so it
may parse them as it likes (``train`` hands them to the ``TrainingArguments`` parser). Errors a user can fix (bad
file, bad import path, unknown flag, invalid argument combination) print one ``trainwell: error: ...`` message and
return exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import textwrap
import math
import shlex
import signal
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .arguments import CLIError
from .output_dir_check import check_output_dir
# What a command needs loads in the function that runs it: `trainwell --help` starts without torch.

PROG = "trainwell"


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
        "Start with 'trainwell train': it trains a small built-in model in about a minute of CPU time.",
    )
    parser.add_argument("--version", action="store_true", help="print the trainwell version and exit")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the full traceback of an error (before the command; or set {DEBUG_ENV}=1)")
    commands = parser.add_subparsers(title="commands", metavar="<command>")
    for sub in _SUBCOMMANDS.values():
        commands.add_parser(sub.name, help=sub.help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trainwell`` command; returns the exit status.

    0 success, 1 a failure, 2 a usage error, 130/143 a run stopped by SIGINT/SIGTERM (its checkpoint saved). Every
    error is one ``trainwell: error:`` line; ``trainwell --debug ...`` or ``TRAINWELL_DEBUG=1`` shows the traceback.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _debug_requested()
    while argv and argv[0] == "--debug":  # before the command: `trainwell train --debug` is TrainingArguments.debug
        debug = True
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        build_top_parser().print_help()
        return 0 if argv else 2
    if argv[0] == "--version":
        from .. import __version__

        print(f"{PROG} {__version__}")
        return 0
    command = _SUBCOMMANDS.get(argv[0])
    try:
        if command is None:
            raise CLIError(_unknown_command_message(argv[0]))
        return command.run(argv[1:])
    except SystemExit as exc:  # argparse inside a subcommand (e.g. its --help)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except BrokenPipeError:  # `trainwell train --help | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as exc:
        if debug:
            raise
        print(f"{PROG}: interrupted" + (f": {exc}" if str(exc) else ""), file=sys.stderr)
        return 130
    except Exception as exc:
        if debug:
            raise
        usage = _is_usage_error(exc)
        message = _one_line(exc) if usage else f"{type(exc).__name__}: {_one_line(exc)}"
        hint = "" if usage else f" (for the traceback: {PROG} --debug {argv[0]} ... or {DEBUG_ENV}=1)"
        print(f"{PROG}: error: {message}{hint}", file=sys.stderr)
        return 2 if usage else 1


def console_main() -> int:
    """The ``trainwell`` executable and ``python -m trainwell``: :func:`main`, then a quiet exit.

    Once the command has returned (its checkpoint saved, its resume line printed), a further Ctrl-C could only
    interrupt the interpreter's shutdown and print a traceback after that line: it is ignored from then on.
    """
    status = main()

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return status


DEBUG_ENV = "TRAINWELL_DEBUG"


def _debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _unknown_command_message(name: str) -> str:
    close = difflib.get_close_matches(name, list(_SUBCOMMANDS), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"choose from {', '.join(_SUBCOMMANDS)}"
    return f"unknown command {name!r}; {hint} (see 'trainwell --help')"


def _is_usage_error(exc: BaseException) -> bool:
    from .recipes.config import RecipeError

    return isinstance(exc, (CLIError, RecipeError, argparse.ArgumentError))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# ------------------------------------------------------------------------------------------------ train

TRAIN_HELP = """\
usage: trainwell train [CONFIG.yaml] [--training_argument VALUE ...]

Train a model with trainwell's Trainer.

  trainwell train
      Train the built-in recipe: a small character-level transformer language model on the text of Python's
      own standard-library docstrings (no download, no extra package). Progress bar, evaluation every
      200 steps, checkpoints in ./trainwell-output, a summary at the end; about a minute of CPU time. Then
      'trainwell plot trainwell-output' draws its curves, 'trainwell generate trainwell-output "Return the"'
      samples from the saved model, and trainwell-output/train.log holds the logs.

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
--eval_strategy no, --resume_from_checkpoint auto ...); flags override the YAML file and the built-in recipe's
defaults. Booleans take --flag / --flag false / --no_flag. --resume_from_checkpoint auto resumes from the newest
checkpoint of --output_dir when there is one and starts fresh otherwise (one command for a job and its requeues);
last (or true) requires a checkpoint; a path names one.

Progress is a bar on a terminal and one plain line every 10 s when the output goes to a file. SIGINT (Ctrl-C) or
SIGTERM saves a checkpoint and stops with exit status 130 or 143, printing the command that resumes.

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
    from ..args.fields import TrainingArguments
    from ..args.parser import ArgParser

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
        model_flags = [r.split("=", 1)[0] for r in flags_only if r.split("=", 1)[0] in _MODEL_FLAGS]
        if model_flags:
            raise CLIError(_own_model_message(model_flags[0]))
        raise CLIError("; ".join(parser._unknown_args_message(flags_only).splitlines()))
    return outputs[0]


#: Flags a user of other training scripts gives to name a model; `trainwell train` takes a recipe instead.
_MODEL_FLAGS = frozenset({"--model", "--model_name_or_path", "--model_path", "--model_name", "--model_dir"})


def _own_model_message(flag: str) -> str:
    return (f"unknown argument {flag}: 'trainwell train' takes no model path; to train a model of your own, write a "
            "recipe naming its factories (model, datasets) by import path and run 'trainwell train my_recipe.yaml' "
            "(an example: examples/recipe.yaml with examples/my_recipe.py; the README's 'Command line' section), or "
            "use the Trainer from Python")


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
    check_deepspeed_config(args)
    check_output_dir(args)
    from .closed_output import output_may_close

    try:
        with output_may_close():  # `trainwell train | head -3` must not end the run
            return run_recipe(recipe, args, argv)
    except KeyboardInterrupt:  # a second Ctrl-C: out now, but say where the run can go on from
        print(f"{PROG}: interrupted; {_newest_checkpoint_and_resume(args, argv)}", file=sys.stderr)
        return SIGNAL_EXIT_STATUS["SIGINT"]


def check_deepspeed_config(args: Any) -> None:
    """A DeepSpeed config that contradicts the arguments fails now, before the recipe and DeepSpeed are loaded
    (the values that depend on the model or the dataset's length are checked again when the engine is built)."""
    if not getattr(args, "deepspeed", None):
        return
    from ..backends.deepspeed.config import resolve_deepspeed_config

    steps = args.max_steps if args.max_steps and args.max_steps > 0 else None
    try:
        resolve_deepspeed_config(args.deepspeed, args, num_training_steps=steps)
    except (ValueError, OSError) as exc:
        raise CLIError(f"--deepspeed {args.deepspeed}: {_one_line(exc)}") from None


def _resume_value(args: Any) -> str | bool | None:
    """``--resume_from_checkpoint last`` (or true) resumes from the newest checkpoint in ``output_dir``; ``auto``
    (kept as is: the Trainer handles it) resumes when there is one and starts fresh otherwise."""
    value = getattr(args, "resume_from_checkpoint", None)
    if isinstance(value, str) and value.lower() in ("last", "true", "latest"):
        from ..checkpoint.layout import list_resumable_checkpoints

        # with a checkpoint_store the Trainer downloads the store's newest (and says so when there is none)
        if not getattr(args, "checkpoint_store", None) and not list_resumable_checkpoints(args.output_dir):
            raise CLIError(f"--resume_from_checkpoint {value}: {args.output_dir} holds no checkpoint to resume from; "
                           "use --resume_from_checkpoint auto to resume when there is one and start fresh otherwise")
        return True
    if isinstance(value, str) and value.strip().lower() not in ("", "auto") and not os.path.isdir(value):
        raise CLIError(f"--resume_from_checkpoint {value}: no such checkpoint folder; pass a checkpoint-<step> "
                       "folder, 'last' (newest checkpoint of --output_dir) or 'auto' (newest if any, else fresh)")
    return value or None


#: Exit status of a run stopped by a signal (128 + the signal number, as a shell reports a killed process).
SIGNAL_EXIT_STATUS = {"SIGINT": 130, "SIGTERM": 143}


def run_recipe(recipe: Any, args: Any, argv: Sequence[str] = ()) -> int:
    """Seed, build the recipe, train, evaluate, save the model, metrics and state, and print the summary.

    A run stopped by SIGINT/SIGTERM prints where its checkpoint is and the command that resumes it (``argv``: the
    arguments after ``trainwell train``), and returns 130/143 without evaluating or printing the summary.
    """
    from .. import Trainer
    from ..checkpoint.preemption import TrainingPreempted
    from ..trainer.checkpointing.run_report import newest_checkpoint_of_run, leave_out_resume_advice
    from ..callbacks.logfile import LogFileCallback
    from ..utils.seeding import set_seed

    use_recipe_threads(recipe)
    set_seed(args.seed)  # before building, so the model's initial weights follow --seed
    components = recipe.build()
    if components.train_dataset is None:
        raise CLIError(f"recipe {recipe.name}: no training dataset; add 'train_dataset' (or 'datasets') to it")
    trainer = Trainer(args=args, **components.trainer_kwargs())
    use_plain_progress(trainer)
    trainer.add_callback(LogFileCallback())
    leave_out_resume_advice(trainer)  # the CLI prints its own resume command (_report_preemption)
    resume = _resume_value(args)
    from .finished_run import nothing_left_to_train

    finished = nothing_left_to_train(args, resume)
    if finished is not None:
        print(f"{PROG}: {finished}", file=sys.stderr)
        return 0
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except TrainingPreempted:
        return _report_preemption(trainer, argv)
    trainer.save_metrics("train", result.metrics)
    eval_metrics: dict[str, Any] = {}
    if components.eval_dataset is not None:
        eval_metrics = _last_eval_metrics(trainer) or trainer.evaluate()
        trainer.save_metrics("eval", eval_metrics)
    trainer.save_model()
    trainer.save_state()
    extra = recipe.finish(components, trainer) if recipe.finish else []
    if trainer.is_world_process_zero():
        print(format_summary(recipe, args, result, eval_metrics, extra, checkpoint=newest_checkpoint_of_run(trainer)))
    return 0


def use_recipe_threads(recipe: Any, environ: Any = None) -> int | None:
    """Set torch's thread count to the recipe's ``num_threads`` unless the user chose one (``OMP_NUM_THREADS``);
    returns the count set, or None."""
    environ = os.environ if environ is None else environ
    wanted = getattr(recipe, "num_threads", None)
    if wanted is None or environ.get("OMP_NUM_THREADS"):
        return None
    import torch

    torch.set_num_threads(wanted)
    return wanted


def use_plain_progress(trainer: Any, stream: Any = None) -> None:
    """When ``stream`` (stderr, where tqdm draws) is not a terminal, swap the progress bar for plain lines."""
    from ..callbacks.plain_progress import PlainProgressCallback
    from ..callbacks.progress import ProgressCallback

    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return
    if trainer.pop_callback(ProgressCallback) is not None:
        trainer.add_callback(PlainProgressCallback(stream=stream))


def _resume_command(argv: Sequence[str]) -> str:
    """``trainwell train ARGV`` with its resume flag replaced by ``--resume_from_checkpoint auto``."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--resume_from_checkpoint":
            skip = True
        elif not arg.startswith("--resume_from_checkpoint="):
            kept.append(arg)
    return shlex.join(["trainwell", "train", *kept, "--resume_from_checkpoint", "auto"])


def _newest_checkpoint_and_resume(args: Any, argv: Sequence[str]) -> str:
    """Where an interrupted run can go on from: its newest complete checkpoint and the command, or that none is."""
    from ..checkpoint.layout import list_complete_checkpoints

    complete = list_complete_checkpoints(args.output_dir) if os.path.isdir(args.output_dir) else []
    if not complete:
        return f"no complete checkpoint in {args.output_dir}; the same command starts over"
    return f"newest complete checkpoint {complete[-1]}; resume with: {_resume_command(argv)}"


def _report_preemption(trainer: Any, argv: Sequence[str]) -> int:
    """One line saying where the checkpoint is and how to resume; the exit status of the signal."""
    signal_name = getattr(trainer, "preempted_by", None) or "SIGTERM"
    from ..trainer.checkpointing.run_report import newest_checkpoint_of_run

    command = _resume_command(argv)
    checkpoint = newest_checkpoint_of_run(trainer)
    where = f"checkpoint {checkpoint}" if checkpoint else "no checkpoint saved" + (
        " (--save_strategy no)" if trainer.args.save_strategy == "no" else "")
    if trainer.is_world_process_zero():
        print(f"{PROG}: preempted by {signal_name} at step {trainer.state.global_step}, {where}; resume with: "
              f"{command}", file=sys.stderr)
    return SIGNAL_EXIT_STATUS.get(signal_name, 143)


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


def summary_rows(recipe: Any, args: Any, result: Any, eval_metrics: dict[str, Any],
                 checkpoint: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """The ``(label, value)`` rows of the end-of-run summary; ``checkpoint`` is the newest one this run wrote or
    resumed from (never another run's)."""
    metrics = result.metrics
    rows = [("recipe", recipe.name), ("steps", str(result.global_step)),
            ("train loss", f"{result.training_loss:.4f} (mean over the run)")]
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
        ("checkpoint", str(checkpoint) if checkpoint else "none"),
        ("model saved to", str(args.output_dir)),
    ]
    return rows


SUMMARY_WIDTH = 80


def format_summary(recipe: Any, args: Any, result: Any, eval_metrics: dict[str, Any],
                   extra: Sequence[tuple[str, str]] = (), width: int = SUMMARY_WIDTH,
                   checkpoint: str | os.PathLike | None = None) -> str:
    """The end-of-run summary: ``label  value`` rows no wider than ``width`` columns.

    A long value is wrapped under its label; a value with line breaks (a generated sample) is shown after the rows
    as an indented block, so its own characters (``|``, tabs) cannot be mistaken for layout.
    """
    rows = summary_rows(recipe, args, result, eval_metrics, checkpoint) + list(extra)
    texts = [(label, value) for label, value in rows if "\n" in value]
    rows = [(label, value) for label, value in rows if "\n" not in value]
    label_width = max(len(label) for label, _ in rows)
    value_width = max(20, width - label_width - 4)
    lines = ["trainwell train: summary", "=" * min(width, 24)]
    for label, value in rows:
        chunks = textwrap.wrap(" ".join(value.split()), value_width, break_on_hyphens=False) or [""]
        for i, chunk in enumerate(chunks):
            lines.append(f"  {(label if i == 0 else '').ljust(label_width)}  {chunk}".rstrip())
    for label, value in texts:
        lines += ["", f"{label}:"]
        for text_line in value.expandtabs(4).splitlines():
            lines += ["    " + chunk for chunk in textwrap.wrap(text_line, width - 4, drop_whitespace=False) or [""]]
    return "\n".join(lines)


add_subcommand("train", "train the built-in recipe or a YAML recipe (any TrainingArguments flag works)", run_train)


def _command(module: str, function: str = "run") -> Callable[[list[str]], int]:
    """The ``run`` of a subcommand whose code is ``function`` of ``trainwell.cli.commands.<module>``: the module is
    imported when the command runs, so that ``trainwell --help`` imports none of the commands."""

    def run(argv: list[str]) -> int:
        command: Callable[[list[str]], int] = getattr(importlib.import_module(f".commands.{module}", __package__),
                                                      function)
        return command(argv)

    return run


add_subcommand("zero-to-fp32", "consolidate a DeepSpeed ZeRO checkpoint into one fp32 weights file",
               _command("deepspeed_tools", "cmd_zero_to_fp32"))
add_subcommand("estimate-memory", "ZeRO-2/3 memory needs: --params N [--gpus G --nodes K]",
               _command("deepspeed_tools", "cmd_estimate_memory"))
add_subcommand("plot", "draw a run's loss, learning rate, grad norm and eval metrics as a PNG: plot OUTPUT_DIR",
               _command("plot"))
add_subcommand("generate", "sample from a model trained by the built-in recipe: generate OUTPUT_DIR \"prompt\"",
               _command("generate"))
add_subcommand("env", "print the versions and devices to paste into a bug report", _command("env"))
add_subcommand("run", "run an unmodified transformers/TRL/sentence-transformers/setfit script on trainwell: "
               "run SCRIPT [ARGS...]", _command("run"))


if __name__ == "__main__":
    sys.exit(main())
