"""ArgParser: build a command line from dataclasses, and fill dataclasses from argv, dicts, json or yaml.

Drop-in for upstream ``HfArgumentParser``: every ``init=True`` field of each dataclass becomes ``--field_name``
(``--field-name`` also works), with help from ``field.metadata["help"]`` and extra option strings from
``field.metadata["aliases"]``. Type mapping:

- ``bool`` / ``Optional[bool]``: ``--flag`` alone means True, ``--flag false`` (true/false/yes/no/1/0/t/f/y/n);
  a bool defaulting to True, or an ``Optional[bool]`` left at None (``--no_tf32``), also gets ``--no_flag``; a bare
  ``bool`` field without a default is an optional flag defaulting to False (as upstream).
- ``Enum`` and ``Literal`` (also ``Union[Enum, str]``): ``choices`` (the enum's values; the dataclass converts them
  in ``__post_init__``).
- ``list[X]``: ``nargs="+"`` of X. ``Optional[X]``: X. ``Union[int, float]``: int for integral text, else float.
- ``dict`` and unions containing ``str`` (``Union[dict, str]``): the raw string (the dataclass parses json);
  a union that also holds a list accepts one value (kept as a string) or several (a list).

Abbreviated flags are refused (``allow_abbrev=False`` unless asked) so a typo is reported, not guessed.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import shlex
import sys
import types
import typing
from collections.abc import Callable, Iterable
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

_TRUE = {"true", "yes", "y", "t", "1", "on"}
_FALSE = {"false", "no", "n", "f", "0", "off"}


#: a negative number in any form float() reads: -3, -.5, -1e-3, -1.5E+2, -inf
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf$")


def string_to_bool(value: str | bool) -> bool:
    """Parse ``true/false/yes/no/1/0`` (any case) into a bool; anything else is an argparse type error."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false, yes/no, 1/0), got {value!r}")


def _int_or_float(value: str) -> int | float:
    """Parse integral text as int (``500``) and anything else as float (``0.1``, ``1e-3``)."""
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number (int or float), got {value!r}") from None


def _choice_type(choices: Iterable[Any]) -> Callable[[str], Any]:
    """Map the text of a choice back to the choice itself (so ``Literal[1, 2]`` yields ints)."""
    by_text = {str(c): c for c in choices}

    def parse(text: str) -> Any:
        return by_text.get(text, text)  # unknown text is left for argparse's "invalid choice" message

    parse.__name__ = "choice"
    return parse


class _OneOrMany(argparse.Action):
    """Store a single value as-is and several values as a list (``--report_to none`` vs ``--report_to a b``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if isinstance(values, list) and len(values) == 1:
            values = values[0]
        setattr(namespace, self.dest, values)


def _is_union(tp: Any) -> bool:
    """True for ``Union[...]``, ``Optional[...]`` and ``X | Y``."""
    return get_origin(tp) is Union or isinstance(tp, types.UnionType)


def _item_kwargs(tp: Any) -> dict[str, Any]:
    """argparse ``type``/``choices`` for one value of type ``tp`` (a list item or a plain field)."""
    if get_origin(tp) is Literal:  # the Literal's own tuple, as upstream's parser keeps it (an Enum's: a list)
        return {"choices": get_args(tp), "type": _choice_type(get_args(tp))}
    if isinstance(tp, type) and issubclass(tp, Enum):
        values = [m.value for m in tp]
        return {"choices": values, "type": _choice_type(values)}
    if tp is bool:
        return {"type": string_to_bool}
    if tp in (dict, Any) or get_origin(tp) is dict or not callable(tp):
        return {"type": str}
    return {"type": tp}


def _union_kwargs(name: str, tp: Any) -> tuple[Any, dict[str, Any] | None]:
    """Reduce a Union: ``Optional[X]`` -> X; number and str-like unions get their own kwargs."""
    members = [a for a in get_args(tp) if a is not type(None)]
    if len(members) == 1:
        return members[0], None
    if set(members) <= {int, float}:
        return tp, {"type": _int_or_float}
    # a Literal of texts or an Enum beside str gives choices; a Literal of other values beside str (upstream's
    # ``str | None | Literal[False]``) is read as the text, as upstream's parser does
    choice_like = [m for m in members if (get_origin(m) is Literal and all(isinstance(a, str) for a in get_args(m)))
                   or (isinstance(m, type) and issubclass(m, Enum))]
    if len(choice_like) == 1 and set(members) - set(choice_like) <= {str}:
        return choice_like[0], None  # Union[IntervalStrategy, str]: the enum's values are the choices (as upstream)
    if str in members or dict in members or any(get_origin(m) is dict for m in members):
        lists = [m for m in members if get_origin(m) in (list, typing.List)]
        if lists:
            return tp, {"type": str, "nargs": "+", "action": _OneOrMany}
        return tp, {"type": str}
    raise ValueError(
        f"field {name!r} has type {tp}, which the parser cannot read from text; use Optional[X], "
        "Union[int, float], or a Union that includes str (and convert it in __post_init__)"
    )


def _type_kwargs(name: str, tp: Any) -> dict[str, Any]:
    """The argparse keyword arguments that come from a field's type."""
    if _is_union(tp):
        tp, done = _union_kwargs(name, tp)
        if done is not None:
            return done
    if tp is bool:
        return {"type": string_to_bool, "nargs": "?", "const": True}
    if get_origin(tp) in (list, typing.List) or tp is list:
        item = get_args(tp)[0] if get_args(tp) else str
        return {"nargs": "+", **_item_kwargs(item)}
    return _item_kwargs(tp)


def _field_default(field: dataclasses.Field) -> Any:
    """The declared default (calling ``default_factory``), or MISSING for a required field."""
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _resolved_types(dtype: type) -> dict[str, Any]:
    """Field types with string annotations (``from __future__ import annotations``) evaluated."""
    try:
        return typing.get_type_hints(dtype)
    except Exception as exc:  # a name in an annotation that the module cannot resolve
        raise TypeError(
            f"cannot resolve the type annotations of {dtype.__name__} ({exc}); define the types it uses at "
            "module level so typing.get_type_hints can find them"
        ) from exc


class ArgParser(argparse.ArgumentParser):
    """An ``argparse.ArgumentParser`` whose options are the fields of one or more dataclasses.

    ``ArgParser(TrainingArguments)`` or ``ArgParser([ModelArgs, TrainingArguments])``; other keyword arguments go
    to ``argparse.ArgumentParser``. The ``parse_*`` methods return one instance per dataclass, in order.
    """

    def __init__(self, dataclass_types: type | Iterable[type] | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)
        # argparse takes "-1e-3" (a negative number in exponent form) for an option and then says the option before
        # it "expected one argument"; every form of a negative number is a value here.
        self._negative_number_matcher = _NEGATIVE_NUMBER
        given: Any = dataclass_types  # one dataclass (an instance too: refused below, naming it) or an iterable
        if given is None:
            given = []
        elif dataclasses.is_dataclass(given):
            given = [given]
        self.dataclass_types: list[type] = list(given)
        for dtype in self.dataclass_types:
            if not (isinstance(dtype, type) and dataclasses.is_dataclass(dtype)):
                raise TypeError(f"ArgParser expects dataclass types, got {dtype!r}; pass the class, not an instance")
            self._add_dataclass_arguments(dtype)

    def _add_dataclass_arguments(self, dtype: type) -> None:
        """Add one option per ``init=True`` field of ``dtype`` (in an argument group when it names one)."""
        group_name = getattr(dtype, "_argument_group_name", None)
        target = self.add_argument_group(group_name) if group_name else self
        hints = _resolved_types(dtype)
        names = frozenset(f.name for f in dataclasses.fields(dtype))  # a field "no_x" keeps its own option
        names |= frozenset(n.replace("_", "-") for n in names)
        for field in dataclasses.fields(dtype):
            if field.init:
                self._add_field(target, field, hints.get(field.name, field.type), names)

    @staticmethod
    def _add_field(target: Any, field: dataclasses.Field, tp: Any, reserved: frozenset[str] = frozenset()) -> None:
        """Add the option(s) for one field: ``--name``, ``--na-me``, aliases, and ``--no_name`` for bools that default
        to True or None (unless ``reserved``, the dataclass's field names, holds ``no_name``)."""
        meta = dict(field.metadata)
        aliases = meta.get("aliases") or []
        aliases = [aliases] if isinstance(aliases, str) else list(aliases)
        options = [f"--{field.name}"]
        if "_" in field.name:
            options.append(f"--{field.name.replace('_', '-')}")
        options += [a for a in aliases if a not in options]
        kwargs = _type_kwargs(field.name, tp)
        for key in ("choices", "metavar", "nargs"):
            if key in meta:
                kwargs[key] = meta[key]
        if meta.get("help") is not None:
            kwargs["help"] = re.sub(r"%(?!\()", "%%", str(meta["help"]))  # argparse %-formats help
        default = _field_default(field)
        is_bool = kwargs.get("type") is string_to_bool and kwargs.get("nargs") == "?"
        if default is dataclasses.MISSING and is_bool:
            default = None if _is_union(tp) else False  # as upstream: a bare bool flag is optional, False
        if default is dataclasses.MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
        target.add_argument(*options, dest=field.name, **kwargs)
        # --no_flag for a bool defaulting to True, and for a tri-state one left unset (--no_tf32)
        if is_bool and (default is True or (default is None and _is_union(tp))):
            no_options = [f"--no_{field.name}"]
            if "_" in field.name:
                no_options.append(f"--no-{field.name.replace('_', '-')}")
            taken = getattr(target, "_option_string_actions", {})
            no_options = [o for o in no_options if o not in taken and o.lstrip("-") not in reserved]
            if no_options:
                target.add_argument(*no_options, action="store_false", dest=field.name, default=default,
                                    help=f"set {field.name} to False")

    # ----------------------------------------------------------------------------------------- command line
    def _read_args_files(self, args: list[str], look_for_args_file: bool, args_filename: str | Path | None,
                         args_file_flag: str | None) -> list[str]:
        """Prepend the arguments found in ``.args`` files (the command line comes last, so it wins)."""
        files: list[tuple[Path, bool]] = []
        if args_filename:
            files.append((Path(args_filename), True))
        elif look_for_args_file and sys.argv and sys.argv[0]:
            files.append((Path(sys.argv[0]).with_suffix(".args"), False))
        if args_file_flag:
            flag_parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
            flag_parser.add_argument(args_file_flag, type=str, action="append", dest="files", default=[])
            found, args = flag_parser.parse_known_args(args)
            files += [(Path(p), True) for p in found.files]
        file_args: list[str] = []
        for path, explicit in files:
            if path.is_file():
                file_args += shlex.split(path.read_text(), comments=True)
            elif explicit:
                raise FileNotFoundError(f"args file {str(path)!r} does not exist; fix the path or drop the option")
        return file_args + args

    def _unknown_args_message(self, remaining: list[str]) -> str:
        """Name every unrecognised token, with the closest valid option when there is one."""
        valid = [opt for action in self._actions for opt in action.option_strings]
        parts = []
        for token in remaining:
            if not token.startswith("-"):
                parts.append(f"unexpected value {token!r} (values must follow their --option)")
                continue
            name = token.split("=", 1)[0]
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f"did you mean {close[0]}?" if close else "run with --help to list the valid options"
            parts.append(f"unknown argument {name}; {hint}")
        return "\n".join(parts)

    def parse_args_into_dataclasses(self, args: list[str] | None = None, return_remaining_strings: bool = False,
                                    look_for_args_file: bool = True, args_filename: str | Path | None = None,
                                    args_file_flag: str | None = None) -> tuple[Any, ...]:
        """Parse ``args`` (default ``sys.argv[1:]``) into one instance per dataclass.

        Arguments from ``args_filename``, from ``<script>.args`` next to ``sys.argv[0]`` (``look_for_args_file``)
        and from every file named by ``args_file_flag`` (e.g. ``"--args_file"``) come before the command line.
        Options added by hand with ``add_argument`` come back as an extra ``argparse.Namespace``. Unknown options
        exit with status 2 and a "did you mean" hint unless ``return_remaining_strings`` is set, in which case the
        unparsed strings are returned last.
        """
        args = list(sys.argv[1:] if args is None else args)
        if args_file_flag or args_filename or look_for_args_file:
            args = self._read_args_files(args, look_for_args_file, args_filename, args_file_flag)
        namespace, remaining = self.parse_known_args(args=args)
        if remaining and not return_remaining_strings:
            self.error(self._unknown_args_message(remaining))
        outputs = self._build(vars(namespace))
        if return_remaining_strings:
            return (*outputs, remaining)
        return tuple(outputs)

    def _build(self, values: dict[str, Any]) -> list[Any]:
        """Instantiate each dataclass from ``values`` (consumed); leftovers become a trailing Namespace."""
        outputs = []
        for dtype in self.dataclass_types:
            keys = {f.name for f in dataclasses.fields(dtype) if f.init}
            outputs.append(dtype(**{k: values.pop(k) for k in list(values) if k in keys}))
        if values:
            outputs.append(argparse.Namespace(**values))
        return outputs

    # ----------------------------------------------------------------------------------------- dict / files
    def parse_dict(self, args: dict[str, Any], allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Build the dataclasses from a flat dict of field values (no argparse, values used as given).

        Keys that belong to no dataclass raise ``ValueError`` naming them and the closest valid fields, unless
        ``allow_extra_keys`` is set.
        """
        if not isinstance(args, dict):
            raise TypeError(f"parse_dict expects a dict of field values, got {type(args).__name__}")
        valid = {f.name for dtype in self.dataclass_types for f in dataclasses.fields(dtype) if f.init}
        extra = sorted(set(args) - valid)
        if extra and not allow_extra_keys:
            raise ValueError(self._extra_keys_message(extra, valid))
        outputs = []
        for dtype in self.dataclass_types:
            keys = {f.name for f in dataclasses.fields(dtype) if f.init}
            outputs.append(dtype(**{k: v for k, v in args.items() if k in keys}))
        return tuple(outputs)

    @staticmethod
    def _extra_keys_message(extra: list[str], valid: set[str]) -> str:
        """The ``ValueError`` text for unused keys, each with its closest valid field name."""
        hints = []
        for key in extra:
            close = difflib.get_close_matches(str(key), sorted(valid), n=1)
            hints.append(f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key))
        return (f"Some keys are not used by the ArgParser: {', '.join(hints)}; fix their names, remove them, or "
                "pass allow_extra_keys=True")

    def parse_json_file(self, json_file: str | Path, allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Read a json object of field values from ``json_file`` and build the dataclasses (see ``parse_dict``)."""
        data = _read_mapping(Path(json_file), "json", json.loads, json.JSONDecodeError)
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)

    def parse_yaml_file(self, yaml_file: str | Path, allow_extra_keys: bool = False) -> tuple[Any, ...]:
        """Read a yaml mapping of field values from ``yaml_file`` and build the dataclasses (see ``parse_dict``)."""
        import yaml  # importing ArgParser loads no yaml (tests/args/test_parser.py)

        data = _read_mapping(Path(yaml_file), "yaml", yaml.safe_load, yaml.YAMLError)
        return self.parse_dict(data, allow_extra_keys=allow_extra_keys)


def _read_mapping(path: Path, kind: str, load: Callable[[str], Any], error: type[Exception]) -> dict[str, Any]:
    """The mapping of field values in the ``kind`` file ``path``; an invalid file or another value raises a
    ``ValueError`` naming the file."""
    try:
        data = load(path.read_text(encoding="utf-8"))
    except error as exc:
        raise ValueError(f"{str(path)!r} is not valid {kind} ({exc}); fix the file") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} must hold a mapping of field names to values, got {type(data).__name__}")
    return data


HfArgumentParser = ArgParser
