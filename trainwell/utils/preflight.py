"""Checks that run before any work: argument value types, the output folder, the dataset types.

Everything here is knowable when ``TrainingArguments`` or the ``Trainer`` is built, so it is checked there, and an
error names the problem and the fix before a single step is trained (instead of a raw ``OSError`` at the first save
or a ``KeyError`` deep inside the DataLoader).
"""

from __future__ import annotations

import errno
import numbers
import os
from dataclasses import fields
from functools import lru_cache
from typing import Any

__all__ = ["FieldTypeError", "coerce_field_types", "check_output_dir", "check_dataset"]


class FieldTypeError(TypeError, ValueError):
    """A field's value of the wrong type: a ``TypeError``, and a ``ValueError`` too, since upstream's own checks
    (``torch_empty_cache_steps="none"``) raise ``ValueError`` for what this check refuses first."""

_SCALARS = {"int": int, "float": float, "bool": bool}
_TRUE, _FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")


@lru_cache(maxsize=None)
def _scalar_fields(cls: type) -> tuple[tuple[str, type, bool], ...]:
    """(name, type, accepts None) of the fields annotated ``int``/``float``/``bool`` (optionally ``| None``).

    A field whose default is None accepts None whatever its annotation (``foo: int = None`` in a user's subclass).
    """
    found = []
    for f in fields(cls):
        declared = _declared_annotation(cls, f.name, f.type)
        annotation = declared.__name__ if isinstance(declared, type) else str(declared)
        parts = [p.strip() for p in annotation.split("|")]
        nullable = "None" in parts or f.default is None
        rest = [p for p in parts if p != "None"]
        if len(rest) == 1 and rest[0] in _SCALARS:
            found.append((f.name, _SCALARS[rest[0]], nullable))
    return tuple(found)


def _declared_annotation(cls: type, name: str, fallback: Any) -> Any:
    """The annotation the class body declares for ``name`` (nearest in the MRO): not the field's ``type``, which
    upstream's ``HfArgumentParser`` overwrites in place with the type it parses (``str | bool`` becomes ``bool``)."""
    for klass in cls.__mro__:
        annotations = vars(klass).get("__annotations__", {})
        if name in annotations:
            return annotations[name]
    return fallback


def _convert(owner: str, name: str, kind: type, value: Any) -> Any:
    if kind is bool:
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        if isinstance(value, int) and value in (0, 1):  # also numpy/torch-free ints; True/False are ints
            return bool(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip()) if kind is float else int(value.strip())
        except ValueError:
            pass
        else:
            return number
    elif kind is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return value  # an int (or numpy number) is a fine float: kept as given, as upstream
    elif kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    elif kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    raise FieldTypeError(f"{owner}.{name} must be {kind.__name__}, got {type(value).__name__} {value!r}; "
                    f"pass a {kind.__name__} (e.g. {name}={kind(1) if kind is not bool else True!r}), or a string "
                    "the command-line parser would accept.")


def coerce_field_types(obj: Any) -> None:
    """Turn numeric/boolean strings of ``int``/``float``/``bool`` fields into their type, as the parser does.

    A value that cannot be converted raises :class:`FieldTypeError` (a ``TypeError`` and a ``ValueError``) naming
    the field and the expected type. One pass over the scalar fields (found once per class); values already of the
    right type cost an ``isinstance``.
    """
    for name, kind, nullable in _scalar_fields(obj.__class__):
        value = getattr(obj, name)
        if value is None and nullable:
            continue
        if kind is float and isinstance(value, float):
            continue
        if type(value) is kind:
            continue
        setattr(obj, name, _convert(type(obj).__name__, name, kind, value))


def check_output_dir(output_dir: str, *, writing: bool) -> None:
    """Raise when ``output_dir`` is a file, sits under a file, or (``writing``) cannot be created or written.

    Nothing is created: the nearest existing folder is only inspected.
    """
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"output_dir={output_dir!r} is an existing file, not a folder; pass another output_dir "
                         "(trainwell writes checkpoints and logs into a folder and never deletes a file it did not "
                         "create).")
    existing = path
    while not os.path.exists(existing):
        parent = os.path.dirname(existing)
        if parent == existing:
            break
        existing = parent
    if not os.path.isdir(existing):
        raise ValueError(f"output_dir={output_dir!r} cannot be created: {existing!r} is a file, not a folder; pass "
                         "an output_dir whose parents are folders.")
    if writing and not os.access(existing, os.W_OK | os.X_OK):
        if _on_read_only_mount(existing):
            where = "" if existing == path else f" (the nearest existing folder is {existing!r})"
            raise OSError(errno.EROFS, f"output_dir={output_dir!r} is on a read-only file system{where}: no "
                          "permission change can make it writable; pass an output_dir on a writable disk, or mount "
                          "this one read-write. Checked before training so that no work is lost at the first save.")
        where = "" if existing == path else f" (the nearest existing folder, {existing!r}, is not writable)"
        raise PermissionError(f"output_dir={output_dir!r} is not writable by this user{where}; pass an output_dir "
                              "you can write to, or fix the folder's permissions. Checked before training so that "
                              "no work is lost at the first save.")


def _on_read_only_mount(folder: str) -> bool:
    """Whether ``folder`` lies on a file system mounted read-only (``os.access`` says only "not writable")."""
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # no statvfs (Windows): the permission message stands
        return False


def _is_dataframe(obj: Any) -> bool:
    module = type(obj).__module__ or ""
    return module.split(".")[0] in ("pandas", "polars") and hasattr(obj, "columns")


def check_dataset(dataset: Any, description: str) -> None:
    """Raise ``TypeError`` for dataset objects the DataLoader would fail on deep inside, saying how to wrap them."""
    if dataset is None:
        return
    name = f"{description}_dataset"
    if _is_dataframe(dataset):
        raise TypeError(
            f"{name} is a {type(dataset).__module__.split('.')[0]} DataFrame; the DataLoader would index it by "
            "column label (KeyError). Wrap it: `datasets.Dataset.from_pandas(df)` (then tokenize with .map), or a "
            "torch Dataset whose __getitem__(i) returns `df.iloc[i].to_dict()`.")
    if hasattr(dataset, "__next__") and not hasattr(dataset, "__getitem__"):
        raise TypeError(
            f"{name} is a {type(dataset).__name__} (a one-shot iterator with no length): wrap it in a "
            "torch.utils.data.IterableDataset that creates a fresh generator on each pass, e.g.\n"
            "    class Stream(torch.utils.data.IterableDataset):\n"
            "        def __iter__(self):\n"
            "            return make_examples()\n"
            f"and pass {name}=Stream() (with max_steps set for training, since it has no length).")
    import torch

    if isinstance(dataset, torch.utils.data.IterableDataset):
        return
    if type(dataset).__module__.split(".")[0] == "ray":
        return  # a Ray Data iterable: read by the loader of prepare_trainer (trainwell.integrations.ray_train)
    if description != "train" and isinstance(dataset, dict):
        return  # a dict of evaluation datasets, each checked on its own
    if isinstance(dataset, dict) and dataset and all(hasattr(v, "__getitem__") and hasattr(v, "__len__")
                                                     and not isinstance(v, (str, bytes)) and hasattr(v, "column_names")
                                                     for v in dataset.values()):
        splits = list(dataset)
        raise TypeError(f"{name} is a {type(dataset).__name__} of the splits {splits}; pick one: "
                        f"{name}=ds[{splits[0]!r}] (and eval_dataset=ds[{splits[-1]!r}] for evaluation).")
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise TypeError(
            f"{name} is a {type(dataset).__name__}, which is neither a map-style dataset (__getitem__ and __len__) "
            "nor a torch IterableDataset; wrap it in a torch Dataset or datasets.Dataset.")
    if isinstance(dataset, dict):
        raise TypeError(
            f"{name} is a dict; the DataLoader would index it by position (KeyError). For columns of equal length "
            "use `datasets.Dataset.from_dict(d)`; for several evaluation sets pass the dict as eval_dataset.")
