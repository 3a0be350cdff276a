"""Guard: every test that starts a process (a subprocess, torchrun, ``accelerate launch``, Ray, DataLoader workers,
``multiprocessing``) is marked ``slow``, so that ``pytest -m "not slow"`` stays a fast inner loop.

The check reads the test files (no imports): a test starts processes when its body, a module-level helper or
fixture it reaches, or a helper imported from ``tests/helpers/launch.py`` does.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# helpers of tests/helpers/launch.py that start processes (free_port, child_env and ROOT do not)
LAUNCH_STARTERS = {"dead_pid", "run", "run_json", "start", "torchrun"}
LAUNCH_MODULES = {"helpers.launch"}  # `from helpers import launch; launch.run(...)` is seen by its attribute
SUBPROCESS_CALLS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "getstatusoutput"}


def _is_slow_mark(node: ast.AST) -> bool:
    """``pytest.mark.slow`` (called or not), alone or inside a list/tuple."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return any(_is_slow_mark(elt) for elt in node.elts)
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "slow"


def _starts_process(node: ast.AST, launch_names: set[str]) -> str | None:
    """What in ``node`` (not descending into nested helpers' definitions) starts a process, or None."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            owner, attr = sub.value.id, sub.attr
            if owner == "subprocess" and attr in SUBPROCESS_CALLS:
                return f"subprocess.{attr}"
            if owner == "launch" and attr in LAUNCH_STARTERS:
                return f"launch.{attr}"
            if owner == "ray" and attr == "init":
                return "ray.init"
            if owner == "os" and attr in {"fork", "system", "spawnv", "posix_spawn"}:
                return f"os.{attr}"
            if attr in {"Process", "Pool", "spawn"} and owner in {"mp", "multiprocessing", "ctx"}:
                return f"{owner}.{attr}"
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in launch_names:
            return f"launch.{sub.func.id}"
        if isinstance(sub, ast.keyword) and sub.arg == "num_workers":
            if not (isinstance(sub.value, ast.Constant) and sub.value.value in (0, None)):
                return "DataLoader workers (num_workers)"
        if isinstance(sub, (ast.Import, ast.ImportFrom)):
            module = sub.module if isinstance(sub, ast.ImportFrom) else None
            names = [alias.name for alias in sub.names]
            if module == "torch.multiprocessing" or "torch.multiprocessing" in names or "multiprocessing" in names:
                return "multiprocessing"
    return None


def _unmarked_process_tests(path: Path) -> list[str]:
    """``file::test`` for each test in ``path`` that starts a process without a ``slow`` mark."""
    tree = ast.parse(path.read_text(), filename=str(path))
    launch_names = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and node.module in LAUNCH_MODULES for alias in node.names if alias.name in LAUNCH_STARTERS}
    module_slow = any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                                                           for t in node.targets) and _is_slow_mark(node.value)
                      for node in tree.body)
    helpers = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def reaches_start(func: ast.AST, seen: set[str]) -> str | None:
        found = _starts_process(func, launch_names)
        if found:
            return found
        names = {n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names |= {a.arg for a in func.args.args}  # fixtures defined in the same module
        for name in sorted(names & helpers.keys() - seen):
            seen.add(name)
            found = reaches_start(helpers[name], seen)
            if found:
                return f"{found} (via {name})"
        return None

    def check(funcs: list[ast.AST], class_slow: bool, prefix: str) -> list[str]:
        bad = []
        for func in funcs:
            if not (isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) and func.name.startswith("test")):
                continue
            if module_slow or class_slow or any(_is_slow_mark(d) for d in func.decorator_list):
                continue
            found = reaches_start(func, {func.name})
            if found:
                bad.append(f"{path.relative_to(TESTS)}::{prefix}{func.name} starts a process ({found})")
        return bad

    bad = check(tree.body, False, "")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            bad += check(node.body, any(_is_slow_mark(d) for d in node.decorator_list), f"{node.name}::")
    return bad


def test_every_test_that_starts_a_process_is_marked_slow():
    bad = [line for path in sorted(TESTS.rglob("test_*.py")) for line in _unmarked_process_tests(path)]
    assert not bad, ("mark these tests @pytest.mark.slow (they start processes; `pytest -m \"not slow\"` is the "
                     "fast loop):\n" + "\n".join(bad))


def test_the_guard_sees_a_subprocess_through_a_helper_and_a_fixture(tmp_path):
    source = tmp_path / "test_example.py"
    source.write_text(
        "import subprocess, pytest\nfrom helpers.launch import run as go\n"
        "def _helper():\n    subprocess.run(['true'])\n"
        "@pytest.fixture\ndef server():\n    go(['x'], 'y', timeout=1)\n"
        "def test_via_helper():\n    _helper()\n"
        "def test_via_fixture(server):\n    pass\n"
        "@pytest.mark.slow\ndef test_marked():\n    _helper()\n"
        "def test_pure():\n    assert 1\n")
    global TESTS
    saved, TESTS = TESTS, tmp_path
    try:
        found = _unmarked_process_tests(source)
    finally:
        TESTS = saved
    assert [line.split(" ")[0] for line in found] == ["test_example.py::test_via_helper",
                                                      "test_example.py::test_via_fixture"]
