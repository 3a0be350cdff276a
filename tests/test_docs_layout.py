"""The package layout as the docs describe it matches the tree: docs/internals.md and the README's development section
have one row per top-level entry of trainwell/ (and nothing else), every file they name exists, and each "where does X
live" location (``path::name``) names a file and a function or class defined in it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "trainwell"
ROW = re.compile(r"^\| `([^`]+)` \|(.*)\|\s*$")
FILE_TOKEN = re.compile(r"`([\w./]+(?:\.py|/))`")
LOCATION = re.compile(r"`(trainwell/[\w/]+\.py)::([\w.]+)`")


def _section(path: Path, heading: str) -> str:
    """The text of ``path`` under ``heading`` (a markdown heading line), up to the next heading of any level."""
    text = path.read_text()
    start = text.index(heading + "\n") + len(heading) + 1
    following = re.search(r"^#{1,6} ", text[start:], flags=re.M)
    return text[start:start + following.start()] if following else text[start:]


def _rows(section: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for line in section.splitlines() if (m := ROW.match(line))}


def _top_level() -> set[str]:
    return {p.name + ("/" if p.is_dir() else "") for p in PACKAGE.iterdir()
            if not p.name.startswith((".", "__pycache__"))}


LAYOUT_TABLES = [(REPO / "docs" / "internals.md", "## Layout"), (REPO / "README.md", "## Development")]


@pytest.mark.parametrize("doc,heading", LAYOUT_TABLES, ids=["internals", "readme"])
def test_layout_table_has_one_row_per_top_level_entry(doc: Path, heading: str):
    rows = _rows(_section(doc, heading))
    assert set(rows) == _top_level(), (
        f"{doc.name} {heading!r}: rows for entries that do not exist: {sorted(set(rows) - _top_level())}; "
        f"entries without a row: {sorted(_top_level() - set(rows))}")


@pytest.mark.parametrize("doc,heading", LAYOUT_TABLES, ids=["internals", "readme"])
def test_every_file_a_layout_row_names_exists(doc: Path, heading: str):
    missing = [f"{entry}{name}" for entry, text in _rows(_section(doc, heading)).items() if entry.endswith("/")
               for name in FILE_TOKEN.findall(text) if not (PACKAGE / entry / name).exists()]
    assert not missing, f"{doc.name} names files that are not in the tree: {missing}"


def _unnamed_modules(folder: Path, row: str) -> list[str]:
    """The modules of ``folder`` (every ``.py`` file, in subpackages too, by its path relative to ``folder``; a
    subpackage as ``name/``) that the layout row text ``row`` does not name."""
    modules = {p.relative_to(folder).as_posix() for p in folder.rglob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.relative_to(folder).as_posix() + "/" for p in folder.rglob("__init__.py") if p.parent != folder}
    return sorted((modules | packages) - set(FILE_TOKEN.findall(row)))


def test_the_layout_table_names_every_module_of_the_trainer():
    """trainer/ holds the facade's files and the checkpoint policy (``checkpointing/``): its row in docs/internals.md
    names each of them, so that a reader of the table sees which file is which."""
    row = _rows(_section(REPO / "docs" / "internals.md", "## Layout"))["trainer/"]
    missing = _unnamed_modules(PACKAGE / "trainer", row)
    assert not missing, f"docs/internals.md's `trainer/` row names no {missing}"


def _table_cells(section: str) -> list[list[str]]:
    """The cells of each body row of the markdown table in ``section`` (header and separator left out)."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]


def test_every_module_of_the_contracts_table_exists():
    cells = _table_cells(_section(REPO / "docs" / "internals.md", "## Modules"))
    named = [name for row in cells for name in FILE_TOKEN.findall(row[0])]
    assert len(named) > 30
    missing = [name for name in named if not (PACKAGE / name).exists()]
    assert not missing, f"docs/internals.md 'Modules' names files that are not in the tree: {missing}"


def _defines(path: Path, dotted: str) -> bool:
    """Whether ``path`` defines ``dotted``: a function, class or assigned name, or ``Class.member``."""
    scope: list[ast.stmt] = ast.parse(path.read_text()).body
    for part in dotted.split("."):
        found = None
        for node in scope:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == part:
                found = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == part for t in targets):
                    found = node
        if found is None:
            return False
        scope = getattr(found, "body", [])
    return True


def test_where_does_x_live_names_ten_behaviours_that_exist():
    rows = {row[0]: row[1] for row in _table_cells(_section(REPO / "docs" / "internals.md", "## Where does X live"))}
    assert len(rows) == 10, list(rows)
    for behaviour, text in rows.items():
        locations = LOCATION.findall(text)
        assert locations, f"{behaviour}: no `trainwell/path.py::name` location"
        for rel, name in locations:
            assert (REPO / rel).is_file(), f"{behaviour}: {rel} does not exist"
            assert _defines(REPO / rel, name), f"{behaviour}: {rel} defines no {name}"


def test_the_checks_are_not_vacuous(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def f(self):\n        pass\n\nTABLE = ()\n")
    assert _defines(module, "A.f") and _defines(module, "TABLE") and not _defines(module, "A.g")
    assert not _defines(module, "f")
    assert _rows("| `a/` | `x.py` |\n| b | c |\n") == {"a/": " `x.py` "}
    assert _table_cells("| h | h |\n|---|---|\n| `a.py`, `b/` | x | y |\n") == [["`a.py`, `b/`", "x", "y"]]
    for name in ("__init__.py", "a.py", "sub/__init__.py", "sub/b.py"):
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text("")
    assert _unnamed_modules(tmp_path / "pkg", "`a.py`, `sub/b.py`") == ["sub/"]
    assert _unnamed_modules(tmp_path / "pkg", "`a.py`, `sub/`") == ["sub/b.py"]
    assert _unnamed_modules(tmp_path / "pkg", "`a.py`, `sub/` (`sub/b.py`)") == []


# Words of the project's own bookkeeping that a reader of the docs cannot know (the upstream documents it was built
# from, its work sessions and issue numbers).
PRIVATE_WORDS = re.compile(r"\bthe seeds\b|\bseed 00\d\b|\bthis stop\b|\bstop \d+\b|\bissue \d+\b|\bthis round\b",
                           re.IGNORECASE)


@pytest.mark.parametrize("doc", [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_the_docs_use_no_word_a_user_cannot_know(doc: Path):
    found = [f"{doc.name}:{n}: {m.group(0)!r}" for n, line in enumerate(doc.read_text().splitlines(), 1)
             for m in PRIVATE_WORDS.finditer(line)]
    assert not found, "; ".join(found)


def test_the_readme_says_its_commands_run_inside_the_clone():
    first_block = (REPO / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert "inside a clone of this repository" in first_block
