"""Run an example script as ``__main__`` with either library's trainer: ``python run_example.py LIBRARY SCRIPT ARGS``.

LIBRARY ``transformers`` runs the script as written (under ``trainwell run run_example.py transformers ...``: the
``trainwell run`` route), ``patch`` calls ``trainwell.patch_transformers()`` first (the patch route). LIBRARY
``trainwell`` rewrites, at import time and in memory,
every ``from transformers import ...`` / ``from transformers.trainer_utils import ...`` statement of the script and of
the modules beside it (``trainer_qa``) so that each name trainwell provides comes from trainwell, the rest still from
transformers: the port a user makes by changing one import, done mechanically, while the file on disk stays as it
is. The rewritten statement keeps its line count, so tracebacks point at the file's own lines.

Either way ``evaluate`` is replaced by :mod:`offline_evaluate` (the scripts' metrics without the network), and the
hub is switched off (``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.util
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
# transformers modules whose names the port takes from trainwell; the value is trainwell's module of the same role.
PORTED_MODULES = {"transformers": "trainwell", "transformers.trainer_utils": "trainwell.trainer_utils"}


def _provided(module: str, name: str) -> bool:
    import importlib

    try:
        getattr(importlib.import_module(module), name)
    except AttributeError:
        return False
    return True


def port_source(source: str) -> str:
    """``source`` with each ``from transformers[.trainer_utils] import a, b`` split into the names trainwell provides
    (imported from trainwell) and the others (still from transformers), on as many lines as the statement had."""
    lines = source.splitlines(keepends=True)
    edits = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in PORTED_MODULES):
            continue
        target = PORTED_MODULES[node.module]
        ours = [a for a in node.names if a.name != "*" and _provided(target, a.name)]
        theirs = [a for a in node.names if a not in ours]
        if not ours:
            continue
        names = lambda aliases: ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in aliases)
        indent = " " * node.col_offset
        parts = [f"from {target} import {names(ours)}"] + ([f"from {node.module} import {names(theirs)}"] if theirs
                                                            else [])
        span = node.end_lineno - node.lineno + 1
        text = indent + "; ".join(parts) + "\n" + "\n" * (span - 1)
        edits.append((node.lineno - 1, node.end_lineno, text))
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines)


class _PortedLoader(importlib.abc.SourceLoader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def get_filename(self, fullname: str) -> str:
        return str(self.path)

    def get_data(self, path: str) -> bytes:
        return port_source(Path(path).read_text()).encode()


class _PortedFinder(importlib.abc.MetaPathFinder):
    """Imports the modules of one folder (the script's) through :func:`port_source`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):
        candidate = self.folder / f"{fullname}.py"
        if "." in fullname or not candidate.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, candidate, loader=_PortedLoader(candidate))


def main(argv: list[str]) -> None:
    """Run ``argv[1]`` (a script path) as ``__main__`` with ``argv[2:]`` as its arguments, ported when ``argv[0]``
    is ``trainwell``."""
    library, script, *args = argv
    if library not in ("transformers", "trainwell", "patch"):
        raise SystemExit(f"run_example.py: LIBRARY must be 'transformers', 'trainwell' or 'patch', not {library!r}")
    if library == "patch":  # the script as written, after trainwell.patch_transformers() (the patch route)
        import trainwell

        trainwell.patch_transformers()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("USE_TF", "0")
    sys.path.insert(0, str(HERE))
    import offline_evaluate

    sys.modules["evaluate"] = offline_evaluate
    path = Path(script).resolve()
    sys.path.insert(0, str(path.parent))
    source = path.read_text()
    if library == "trainwell":
        sys.meta_path.insert(0, _PortedFinder(path.parent))
        source = port_source(source)
    sys.argv = [str(path), *args]
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    sys.modules["__main__"] = module  # the script's dataclasses resolve their annotations in its own namespace
    exec(compile(source, str(path), "exec"), module.__dict__)


if __name__ == "__main__":
    main(sys.argv[1:])
