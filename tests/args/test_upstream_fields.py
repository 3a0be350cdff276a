"""Every field of upstream's ``TrainingArguments`` and ``Seq2SeqTrainingArguments`` (read from the installed
transformers at test time), held to trainwell's: present, the same declared default, a compatible annotation and the
same value after ``__post_init__``, or listed for that aspect in ``trainwell.args.differences.FIELD_DIFFERENCES`` (the
table the README shows). The same for the ``__post_init__`` outcomes libraries read (``distributed_state``,
``deepspeed_plugin``, ``n_gpu``, ``world_size``...) on a default construction in one process. A new upstream release
shows each new field or changed default here as a failing test."""

from __future__ import annotations

import dataclasses
import enum
import re
import typing
from pathlib import Path

import pytest

import trainwell
from trainwell.args.differences import FIELD_DIFFERENCES, markdown_table

transformers = pytest.importorskip("transformers")

PAIRS = [(transformers.TrainingArguments, trainwell.TrainingArguments),
         (transformers.Seq2SeqTrainingArguments, trainwell.Seq2SeqTrainingArguments)]
README = Path(__file__).resolve().parents[2] / "README.md"
#: what __post_init__ (and the properties it resolves) leaves for libraries to read, beyond the fields
OUTCOMES = ("parallelism_config", "deepspeed_plugin", "_n_gpu", "n_gpu", "world_size", "device", "process_index",
            "local_process_index", "should_save", "should_log", "train_batch_size", "eval_batch_size",
            "place_model_on_device", "parallel_mode", "ddp_timeout_delta")
STATE = ("distributed_type", "num_processes", "process_index", "local_process_index", "is_main_process",
         "is_local_main_process", "use_distributed", "device")


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _declared(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return _plain(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return _plain(field.default_factory())
    return dataclasses.MISSING


def _type_names(tp) -> set[str]:
    """The names of the types a value of annotation ``tp`` may have (Unions flattened, generics by their origin,
    a Literal by its values' types)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        return set().union(*(_type_names(arg) for arg in typing.get_args(tp)))
    if origin is typing.Literal:
        return {type(v).__name__ for v in typing.get_args(tp)}
    if origin is not None:
        return {getattr(origin, "__name__", str(origin))}
    if tp is type(None):
        return {"None"}
    return {getattr(tp, "__name__", str(tp).rsplit(".", 1)[-1])}


def _differences(upstream_cls, ours_cls, tmp_path) -> dict[str, set[str]]:
    """field -> the aspects in which trainwell's differs from upstream's ("missing" when it has none)."""
    theirs_fields = {f.name: f for f in dataclasses.fields(upstream_cls)}
    ours_fields = {f.name: f for f in dataclasses.fields(ours_cls)}
    their_hints = typing.get_type_hints(upstream_cls)
    our_hints = typing.get_type_hints(ours_cls)
    theirs = upstream_cls(output_dir=str(tmp_path), report_to="none")
    ours = ours_cls(output_dir=str(tmp_path), report_to="none")
    found: dict[str, set[str]] = {}
    for name, field in theirs_fields.items():
        if name not in ours_fields:
            found[name] = {"missing"}
            continue
        aspects = set()
        if _declared(field) != _declared(ours_fields[name]):
            aspects.add("default")
        mine = _type_names(our_hints[name])
        if not (_type_names(their_hints[name]) <= mine or "Any" in mine):
            aspects.add("type")
        # disable_tqdm follows each library's own logger level (other tests change transformers')
        if name != "disable_tqdm" and _plain(getattr(theirs, name)) != _plain(getattr(ours, name)):
            aspects.add("value")
        if aspects:
            found[name] = aspects
    return found


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: p[0].__name__)
def test_every_upstream_field_is_here_alike_or_listed_with_the_reason(tmp_path, pair):
    upstream_cls, ours_cls = pair
    found = _differences(upstream_cls, ours_cls, tmp_path)
    listed = {name: set(diff.aspects) for name, diff in FIELD_DIFFERENCES.items() if name in found or
              name in {f.name for f in dataclasses.fields(upstream_cls)}}
    unexplained = {name: aspects - listed.get(name, set()) for name, aspects in found.items()}
    assert {k: v for k, v in unexplained.items() if v} == {}, \
        "fix the field, or list the aspect in trainwell/args/differences.py with the reason"
    stale = {name: aspects - found.get(name, set()) for name, aspects in listed.items()}
    assert {k: v for k, v in stale.items() if v} == {}, "differences.py lists a difference that is gone"
    count = len(dataclasses.fields(upstream_cls))
    assert count >= 114  # the fields checked (114 of TrainingArguments, 119 of Seq2SeqTrainingArguments in 5.24)


def test_every_listed_field_is_an_upstream_field():
    upstream = {f.name for cls, _ in PAIRS for f in dataclasses.fields(cls)}
    assert set(FIELD_DIFFERENCES) <= upstream


def test_post_init_outcomes_libraries_read_are_upstream_values(tmp_path):
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    ours = trainwell.TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert {name: _plain(getattr(ours, name)) for name in OUTCOMES} == \
        {name: _plain(getattr(theirs, name)) for name in OUTCOMES}
    assert {name: _plain(getattr(ours.distributed_state, name)) for name in STATE} == \
        {name: _plain(getattr(theirs.distributed_state, name)) for name in STATE}


def test_the_readme_shows_the_table():
    text = README.read_text()
    start = text.index("### Arguments that differ from transformers")
    section = text[start:]
    table = re.search(r"\n(\| Field \|.*?\n)(?!\|)", section, flags=re.S)
    assert table is not None and table.group(1) == markdown_table(), \
        "paste trainwell.args.differences.markdown_table() into the README"
