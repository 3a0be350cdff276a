"""Which Trainer attributes the Trainer's parts write: a ratchet toward one explicit run object.

The target (ARCHITECTURE.md, "The run and the step"): no Trainer attribute is assigned outside
``trainer/trainer.py`` and the run object's constructor. Until the run object exists, the writes that remain are
listed here per module; a new write fails this test (give the part a return value or a run object field instead),
and a listed write that is gone must be taken off the list, so the list only shrinks.

``control`` is upstream's: every callback event returns it and upstream's loop assigns it where the event is called.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "trainwell"

UPSTREAM_WRITES = {"control"}  # each event's result, assigned where the event is called (as upstream's loop)

REMAINING: dict[str, set[str]] = {
    "loops/run.py": {"state", "model", "model_wrapped", "optimizer", "lr_scheduler", "_train_batch_size", "_tw_run"},
}


def _trainer_writes(path: Path) -> set[str]:
    """Attributes assigned on a name ``trainer`` in ``path`` (``trainer.x = ...``, ``trainer.x += ...``, tuple
    targets too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                    and target.value.id == "trainer":
                found.add(target.attr)
    return found - UPSTREAM_WRITES


def test_trainer_attributes_are_written_only_where_listed():
    writes: dict[str, set[str]] = defaultdict(set)
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel != "trainer/trainer.py":
            attrs = _trainer_writes(path)
            if attrs:
                writes[rel] = attrs
    new = {rel: sorted(attrs - REMAINING.get(rel, set())) for rel, attrs in writes.items()
           if attrs - REMAINING.get(rel, set())}
    assert not new, f"Trainer attributes assigned outside trainer/trainer.py: {new}; return the value (or keep it " \
                    "on the loop's own state) instead"
    gone = {rel: sorted(attrs - writes.get(rel, set())) for rel, attrs in REMAINING.items()
            if attrs - writes.get(rel, set())}
    assert not gone, f"no longer written there: remove {gone} from REMAINING in tests/test_trainer_writes.py"


def test_the_finder_sees_plain_augmented_and_tuple_writes(tmp_path):
    source = tmp_path / "probe.py"
    source.write_text("def f(trainer, other):\n    trainer.a = 1\n    trainer.b += 2\n"
                      "    trainer.c, (trainer.d, x) = 1, (2, 3)\n    other.e = 4\n    trainer.control = 5\n"
                      "    trainer.f: int = 6\n")
    assert _trainer_writes(source) == {"a", "b", "c", "d", "f"}
