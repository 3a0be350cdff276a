"""Every method of upstream's ``Trainer`` that TRL, sentence-transformers, setfit or PEFT calls or overrides exists on
trainwell's ``Trainer`` with a compatible signature, found by reading the installed libraries' source at test time
(tests/compat/upstream_surface.py), so a new release of any of them shows a gap as a failing test.

Compatible: every call upstream's signature accepts (each positional count, every keyword it names) binds to
trainwell's, every call the library writes binds too, and the defaults are upstream's. What trainwell lacks on purpose
is in ``DELIBERATELY_MISSING`` with the reason; nothing is skipped silently (a stale entry fails too).

Counts with trl 1.16, sentence-transformers 6.2, setfit 1.2, peft 0.21 and transformers 5.24: 31 Trainer classes,
41 upstream method names used (41 found, 40 checked, 1 in the table).
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

import pytest

import trainwell

transformers = pytest.importorskip("transformers")

from upstream_surface import trainer_classes, trainer_uses  # noqa: E402

pytestmark = pytest.mark.slow  # imports the four libraries and reads their source: 5 to 20 s

LIBRARIES = tuple(name for name in ("trl", "sentence_transformers", "setfit", "peft")
                  if importlib.util.find_spec(name) is not None)

#: upstream method name -> why trainwell's Trainer has none
DELIBERATELY_MISSING = {
    "_inner_training_loop": "trainwell's loop is the run object of trainwell/loops (train_loop.py), not a Trainer "
                            "method; TRL's experimental async trainers (AsyncGRPO, AsyncDistillation) wrap it, and "
                            "those are not supported",
}

#: upstream method name -> parameter -> why trainwell's default differs
DEFAULT_DIFFERENCES: dict[str, dict[str, str]] = {}


def upstream_methods() -> set[str]:
    """The names on ``transformers.Trainer`` that are functions (methods, static and class methods)."""
    names = set()
    for name in dir(transformers.Trainer):
        raw = inspect.getattr_static(transformers.Trainer, name)
        if inspect.isfunction(raw) or isinstance(raw, (staticmethod, classmethod)):
            names.add(name)
    return names


@pytest.fixture(scope="module")
def uses() -> dict[str, Any]:
    if not LIBRARIES:
        pytest.skip("none of trl, sentence-transformers, setfit, peft is installed")
    return trainer_uses(LIBRARIES, upstream_methods())


def _call_shapes(signature: inspect.Signature) -> list[tuple[int, tuple[str, ...]]]:
    """The calls ``signature`` accepts, as (positional count, keyword names): each positional count from the
    required ones to all, with the other named parameters as keywords (all of them, and none of the optional)."""
    params = [p for p in signature.parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_pos = sum(p.default is p.empty for p in positional)
    shapes = []
    for count in range(required_pos, len(positional) + 1):
        rest = [p for p in params[count:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        shapes.append((count, tuple(p.name for p in rest)))
        shapes.append((count, tuple(p.name for p in rest if p.default is p.empty)))
    return shapes


def _binds(signature: inspect.Signature, shape: tuple[int, tuple[str, ...]]) -> bool:
    count, keywords = shape
    try:
        signature.bind(None, *range(count), **{k: None for k in keywords})  # None stands for self
    except TypeError:
        return False
    return True


def incompatibilities(name: str, calls: list[tuple[int, tuple[str, ...]]]) -> list[str]:
    """What keeps trainwell's ``name`` from taking upstream's calls (and the library's), and default differences."""
    theirs = inspect.signature(inspect.getattr_static(transformers.Trainer, name).__get__(None, object)
                               if False else getattr(transformers.Trainer, name))
    ours = inspect.signature(getattr(trainwell.Trainer, name))
    problems = [f"{name}{theirs} call {shape} fails on trainwell's {name}{ours}"
                for shape in _call_shapes(theirs) if _binds(theirs, shape) and not _binds(ours, shape)]
    problems += [f"the library's call {name}{shape} fails on trainwell's {name}{ours}"
                 for shape in calls if _binds(theirs, shape) and not _binds(ours, shape)]
    known = DEFAULT_DIFFERENCES.get(name, {})
    for param in theirs.parameters.values():
        mine = ours.parameters.get(param.name)
        if (mine is not None and param.default is not param.empty and mine.default is not mine.empty
                and param.name not in known and not _same(param.default, mine.default)):
            problems.append(f"{name}({param.name}=...): default {mine.default!r}, upstream {param.default!r}")
    return problems


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or str(a) == str(b)  # enums: upstream's and trainwell's members compare by value
    except Exception:
        return a is b


def test_the_libraries_trainer_classes_are_found():
    """The walk finds the trainers a user knows (a walk finding nothing would make the other tests vacuous)."""
    if not LIBRARIES:
        pytest.skip("none of trl, sentence-transformers, setfit, peft is installed")
    found = {name.rsplit(".", 1)[1] for name in trainer_classes(LIBRARIES)}
    expected = {"trl": {"SFTTrainer", "DPOTrainer", "GRPOTrainer", "RewardTrainer"},
                "sentence_transformers": {"SentenceTransformerTrainer", "CrossEncoderTrainer"}}
    for library, names in expected.items():
        if library in LIBRARIES:
            assert names <= found, sorted(found)


def test_every_method_the_libraries_use_exists_on_trainwell(uses):
    missing = sorted(name for name in uses if not hasattr(trainwell.Trainer, name))
    unexplained = [f"{name} ({', '.join(sorted(uses[name].how))} in {', '.join(sorted(uses[name].where)[:3])})"
                   for name in missing if name not in DELIBERATELY_MISSING]
    assert not unexplained, "upstream Trainer methods the libraries use, missing from trainwell: " + "; ".join(
        unexplained)


def test_the_table_of_missing_methods_is_current(uses):
    """Each entry is still used by a library and still missing (a stale entry would hide a future gap)."""
    for name in DELIBERATELY_MISSING:
        assert name in uses, f"{name} is no longer used by {LIBRARIES}: remove it from DELIBERATELY_MISSING"
        assert not hasattr(trainwell.Trainer, name), f"trainwell has {name} now: remove it from the table"


def test_every_used_method_has_a_compatible_signature(uses):
    problems = []
    for name in sorted(uses):
        if hasattr(trainwell.Trainer, name):
            problems += incompatibilities(name, uses[name].calls)
    assert not problems, "\n".join(problems)
