"""Upstream's ``transformers.HfArgumentParser`` (and TRL's ``TrlParser``, its subclass) reads trainwell's argument
classes as it reads its own: scripts run under ``trainwell.patch_transformers()`` or ``trainwell run`` build it on
trainwell's swapped classes.

Every ``init`` field is read from the classes at test time (none is listed by hand), so a new field whose annotation
upstream's parser cannot handle fails here. For each class: upstream's parser builds on it, ``--help`` renders and
names every field, and a generated command line that sets each field to a value other than its default parses to
the same values as upstream's parser on upstream's own class (field by field, for the fields both have): in
argparse's namespace for every field, and through ``parse_args_into_dataclasses`` (``__post_init__`` included) for a
representative line, one field of each kind of option. trainwell's own ``HfArgumentParser`` is held to the same.
A library's config (TRL's ``SFTConfig``) built on trainwell's class under the patch: :func:`test_a_library_config_
under_the_patch_parses_as_upstream` (in fresh processes).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
from enum import Enum
from typing import Any

import pytest

import trainwell

transformers = pytest.importorskip("transformers")

from transformers import HfArgumentParser as UpstreamParser  # noqa: E402

PAIRS = {"TrainingArguments": (trainwell.TrainingArguments, transformers.TrainingArguments),
         "Seq2SeqTrainingArguments": (trainwell.Seq2SeqTrainingArguments, transformers.Seq2SeqTrainingArguments)}


DICT_FIELDS = set(transformers.TrainingArguments._VALID_DICT_FIELDS)


def init_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init]


def unreadable(ours: type, theirs: type) -> set[str]:
    """The fields the generated lines leave out: those no text sets with upstream's parser on upstream's class."""
    return set(init_fields(ours)) - set(_generated(ours, theirs)[0])


def field_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> the field's own option (not the ``--no_x`` complement added after it)."""
    actions: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.option_strings and action.option_strings[0] == f"--{action.dest}":
            actions.setdefault(action.dest, action)
    return actions


def _plain(value: Any) -> Any:
    """An enum member as its value (upstream's and trainwell's enums are different classes with the same values)."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, os.PathLike):  # Seq2Seq's generation_config: trainwell keeps a path as text (seq2seq.py)
        return os.fspath(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def option_value(action: argparse.Action) -> list[str]:
    """Command-line text giving the option a value of its type other than its default."""
    default = _plain(action.default)
    kind = getattr(action.type, "__name__", "")
    if action.choices:
        text = next(str(c) for c in action.choices if _plain(c) != default and str(_plain(c)) != str(default))
        values = [text]
    elif isinstance(action.type, type) and issubclass(action.type, Enum):  # list[DebugOption]: no choices given
        values = [next(str(m.value) for m in action.type if m.value != default)]
    elif kind == "string_to_bool":
        values = ["false" if default is True else "true"]
    elif action.dest in DICT_FIELDS:  # a JSON object, as both classes take it
        values = ['{"a": 1}']
    elif action.type is int:
        values = [str(default + 1 if isinstance(default, int) and not isinstance(default, bool) else 3)]
    elif action.type is float:
        values = ["0.375"]
    else:
        values = [f"text_{action.dest}"]
    if action.nargs == "+":
        values = values + (values if action.type not in (str, int, float) else [values[0] + "_2"])
    return values


def command_line(reference: dict[str, argparse.Action], names: list[str]) -> list[str]:
    argv: list[str] = []
    for name in names:
        argv += [f"--{name}", *option_value(reference[name])]
    return argv


def _generated(ours: type, theirs: type, parser_class: type = UpstreamParser
               ) -> tuple[list[str], dict[str, argparse.Action]]:
    """The fields of ``ours``, and the options values are generated from: upstream's option where upstream's class
    has the field (upstream is the reference), else the option ``parser_class`` makes of trainwell's field."""
    mine = field_actions(parser_class(ours))
    reference = {**mine, **field_actions(UpstreamParser(theirs))}
    for name, action in reference.items():
        if not action.choices and name in mine and mine[name].choices:  # trainwell checks the text sooner
            reference[name] = mine[name]
    return [n for n in init_fields(ours) if readable(reference[n])], reference


def readable(action: argparse.Action) -> bool:
    """Whether the option takes text at all: upstream's ``parallelism_config`` (an accelerate ``ParallelismConfig``)
    has its class as ``type``, which cannot be built from a string, on upstream's class too."""
    try:
        for text in option_value(action):
            action.type(text) if callable(action.type) else None
    except (TypeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_upstream_parser_builds_on_every_field_and_renders_help(name):
    ours, _ = PAIRS[name]
    parser = UpstreamParser(ours)  # raised "str | bool | None is not callable" on trackio_static_space_id
    actions = field_actions(parser)
    assert set(init_fields(ours)) <= set(actions), sorted(set(init_fields(ours)) - set(actions))
    text = parser.format_help()
    assert all(f"--{field}" in text for field in init_fields(ours))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        parser.parse_args(["--help"])
    assert done.value.code == 0 and "--trackio_static_space_id" in out.getvalue()


def test_the_class_still_converts_its_values_after_upstreams_parser_read_it(tmp_path):
    """Upstream's parser overwrites each field's ``type`` in place with the type it parses (``str | bool`` becomes
    ``bool``); the class's own conversion reads the declared annotations, so "all" stays a valid value."""
    from trainwell.utils.preflight import _scalar_fields

    UpstreamParser(trainwell.TrainingArguments)
    _scalar_fields.cache_clear()  # as in a process whose first arguments come after the parser
    args = trainwell.TrainingArguments(str(tmp_path), include_num_input_tokens_seen="all", report_to="none")
    assert args.include_num_input_tokens_seen == "all"


@pytest.mark.parametrize("parser_class", [UpstreamParser, trainwell.HfArgumentParser],
                         ids=["upstream_parser", "trainwell_parser"])
@pytest.mark.parametrize("name", sorted(PAIRS))
def test_every_field_parses_to_upstreams_value(name, parser_class):
    """Namespace level, every field at once: what the parser hands the dataclass is what upstream's parser hands
    upstream's class."""
    ours, theirs = PAIRS[name]
    names, reference = _generated(ours, theirs, parser_class)
    argv = command_line(reference, names)
    got = vars(parser_class(ours).parse_args(argv))
    assert set(names) <= set(got)
    # the fields left out are upstream's own that no text sets on upstream's class either (parallelism_config: an
    # accelerate ParallelismConfig; liger_kernel_config: a dict), every other field is compared
    assert unreadable(ours, theirs) <= set(init_fields(theirs))
    assert all(not readable(field_actions(UpstreamParser(theirs))[n]) for n in unreadable(ours, theirs))
    assert all(_plain(got[n]) != _plain(reference[n].default) or reference[n].default is None for n in names
               if reference[n].nargs != "+")  # each value is a change from the default (bar None-defaulted lists)
    shared = [n for n in names if n in init_fields(theirs)]
    expected = vars(UpstreamParser(theirs).parse_args(command_line(reference, shared)))
    differ = {n: (got[n], expected[n]) for n in shared if not same(got[n], expected[n], parser_class)}
    assert not differ, differ


def same(mine: Any, upstream: Any, parser_class: type) -> bool:
    """Equal values; with trainwell's parser, which keeps the text of a union that includes ``str`` (its dataclass
    converts it: ``include_num_input_tokens_seen`` "true" is True), equal as text."""
    if _plain(mine) == _plain(upstream):
        return True
    return parser_class is not UpstreamParser and isinstance(mine, str) and mine.lower() == str(upstream).lower()


def _representative(ours: type, theirs: type, tmp_path) -> list[str]:
    """One field of each kind of option (type, nargs, choices, the bool default) with a value other than its
    default, that both classes accept together with the others chosen so far."""
    names, reference = _generated(ours, theirs)
    shared = [n for n in names if n in init_fields(theirs) and n != "output_dir"]
    chosen: list[str] = ["trackio_static_space_id"]  # the field upstream's parser could not read (issue 41)
    kinds: set[tuple] = set()
    upstream, mine = UpstreamParser(theirs), UpstreamParser(ours)
    for n in shared:
        action = reference[n]
        kind = (getattr(action.type, "__name__", None), action.nargs, bool(action.choices), action.default is True,
                action.default is None)
        if kind in kinds or n in chosen:
            continue
        argv = ["--output_dir", str(tmp_path), *command_line(reference, [*chosen, n])]
        try:
            upstream.parse_args_into_dataclasses(argv, look_for_args_file=False)
            mine.parse_args_into_dataclasses(argv, look_for_args_file=False)
        except Exception:  # a value refused by a class's own checks (a path that must exist, a CUDA-only switch,
            continue  # a combination trainwell refuses sooner than upstream): validation, not parsing
        chosen.append(n)
        kinds.add(kind)
    return chosen


@pytest.mark.slow  # builds upstream's TrainingArguments: its first construction loads modules (over a second)
@pytest.mark.parametrize("parser_class", [UpstreamParser, trainwell.HfArgumentParser],
                         ids=["upstream_parser", "trainwell_parser"])
def test_a_representative_line_parses_into_the_same_dataclass_values(tmp_path, parser_class):
    ours, theirs = PAIRS["Seq2SeqTrainingArguments"]  # a subclass of TrainingArguments: every field of both
    chosen = _representative(ours, theirs, tmp_path)
    assert "trackio_static_space_id" in chosen and len(chosen) >= 10, chosen
    _, reference = _generated(ours, theirs)
    argv = ["--output_dir", str(tmp_path), *command_line(reference, chosen)]
    (mine,) = parser_class(ours).parse_args_into_dataclasses(argv, look_for_args_file=False)
    (upstream,) = UpstreamParser(theirs).parse_args_into_dataclasses(argv, look_for_args_file=False)
    assert type(mine) is ours
    differ = {n: (getattr(mine, n), getattr(upstream, n)) for n in chosen
              if _plain(getattr(mine, n)) != _plain(getattr(upstream, n))}
    assert not differ, differ


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl is not installed")
def test_a_library_config_under_the_patch_parses_as_upstream():
    """TRL's ``SFTConfig`` built on trainwell's ``TrainingArguments`` (the patch) under upstream's parser: it builds
    (TRL's ``TrlParser`` too), ``--help`` names every field, and the generated line of TRL's ``SFTConfig`` on
    upstream's class parses to the same values, field by field. Each side in a fresh process (the patch must come
    before TRL's import): upstream's side first, which writes the line."""
    code = textwrap.dedent("""
        import json, sys
        if sys.argv[1] == "patched":
            import trainwell
            trainwell.patch_transformers()
        import transformers
        from trl import SFTConfig, TrlParser
        sys.path.insert(0, sys.argv[2])
        import test_upstream_argparser as t
        TrlParser(SFTConfig)
        parser = transformers.HfArgumentParser(SFTConfig)
        names, help_text, actions = t.init_fields(SFTConfig), parser.format_help(), t.field_actions(parser)
        line = [n for n in names if t.readable(actions[n])]
        parser.parse_args(t.command_line(actions, line))  # every readable field of this side's class
        given = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {n: t.option_value(actions[n]) for n in line}
        # a value upstream's option takes that trainwell's choices refuse (torch_compile_mode): this side's choice
        stricter = [n for n, v in given.items() if actions[n].choices and v[0] not in map(str, actions[n].choices)]
        given.update({n: t.option_value(actions[n]) for n in stricter})
        got = parser.parse_args([x for n, v in given.items() for x in (f"--{n}", *v)])
        print(json.dumps({"base": [c.__module__ for c in SFTConfig.__mro__], "help": all(f"--{n}" in help_text
                          for n in names), "line": line, "names": names, "given": given, "stricter": stricter,
                          "values": {n: repr(t._plain(v)) for n, v in vars(got).items()}}))
    """)
    here = str(__import__("pathlib").Path(__file__).parent)

    def side(*args: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    theirs = side("upstream", here)
    ours = side("patched", here, json.dumps(theirs["given"]))
    assert any(m.startswith("trainwell.") for m in ours["base"]) and not any(
        m.startswith("trainwell.") for m in theirs["base"])
    assert ours["help"] and theirs["help"]
    assert set(theirs["line"]) <= set(ours["line"]) and set(ours["names"]) - set(ours["line"]) <= set(
        theirs["names"]) - set(theirs["line"])  # what no text sets on trainwell's side, none sets upstream either
    # trainwell's stricter choices are TrainingArguments' (their values are compared by the tests above)
    assert set(ours["stricter"]) <= set(init_fields(trainwell.TrainingArguments)), ours["stricter"]
    differ = {n: (ours["values"][n], theirs["values"][n]) for n in theirs["line"]
              if n not in ours["stricter"] and ours["values"][n] != theirs["values"][n]}
    assert not differ, differ
