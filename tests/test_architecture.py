"""The package's layering: a lower layer never imports a higher one, and importing trainwell stays light."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trainwell"

# Each top-level module/package of trainwell and its layer; a module may import only from layers <= its own.
# A dotted key gives a module inside a package its own layer (the longest matching key wins).
LAYERS: dict[str, int] = {
    # the bottom: small helpers that import nothing else of trainwell
    "utils": 0,
    # foundations: data, optimisers
    "data": 1, "optim": 1,
    # the DeepSpeed config is pure data, read by TrainingArguments
    "backends.deepspeed.config": 1,
    # configuration, the process, the file format of checkpoints
    "args": 2, "runtime": 2, "checkpoint": 2,
    # callbacks and execution backends (never the loops or the trainer)
    "callbacks": 3, "backends": 3,
    "loops": 4,
    # the facade, its parts (trainer/checkpointing/ too) and Seq2SeqTrainer
    "trainer": 5, "hpsearch": 5,
    "cli": 7, "__main__": 7, "__init__": 7,
    # the top: modules that mirror upstream module names; the only layer that re-exports from anywhere
    "compat": 8,
    # upstream's module names at the top of the package, each a file that puts its compat module in its place
    "trainer_utils": 8, "integrations": 8, "debug_utils": 8, "tf": 8,
}
# The files giving compat modules the names users import (``from trainwell.trainer_utils import ...``); not parts of
# the architecture, so the top level's budget does not count them.
UPSTREAM_NAMES = ("debug_utils.py", "integrations.py", "tf.py", "trainer_utils.py")
# Documented exceptions: (importer, imported) pairs allowed to point up, each imported lazily inside a function.
ALLOWED: set[tuple[str, str]] = set()


def _layer_key(dotted: str) -> str:
    """The LAYERS key governing the trainwell module ``dotted`` ("backends.ddp" -> "backends")."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in LAYERS:
            return ".".join(parts[:end])
    return parts[0]


def _owner(path: Path) -> str:
    parts = [p for p in path.relative_to(PACKAGE).with_suffix("").parts if p != "__init__"]
    return _layer_key(".".join(parts)) if parts else "__init__"


def _imports(path: Path) -> set[str]:
    """Top-level trainwell names imported anywhere in ``path`` (module level and inside functions)."""
    return {name.split(".")[0] for name in _imported_modules(path)}


def _imported_modules(path: Path) -> set[str]:
    """Dotted trainwell modules (or names) imported anywhere in ``path``, relative to the package."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package_parts = list(rel[:-1]) if path.name != "__init__.py" else list(rel[:-1])
    found: set[str] = set()
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = base + (node.module.split(".") if node.module else [])
                if not node.module:  # "from . import x": x is a module of that package
                    found.update(".".join(target[1:] + [alias.name]) for alias in node.names)
                    continue
            elif node.module and node.module.split(".")[0] == "trainwell":
                target = node.module.split(".")
            else:
                continue
            if len(target) > 1:
                found.add(".".join(target[1:]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "trainwell" and len(parts) > 1:
                    found.add(".".join(parts[1:]))
    return found


def test_every_module_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))}
    assert names - {key.split(".")[0] for key in LAYERS} == set(), "give the new module a layer in tests/test_architecture.py"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_higher_layer(path: Path):
    owner = _owner(path)
    level = LAYERS[owner]
    imported = {_layer_key(name) for name in _imported_modules(path)}
    upward = sorted(name for name in imported
                    if name in LAYERS and name != owner and LAYERS[name] > level and (owner, name) not in ALLOWED)
    assert not upward, f"{path.relative_to(PACKAGE.parent)} (layer {level}) imports higher layers: {upward}"


def test_backends_never_import_the_loops_or_the_trainer():
    for path in (PACKAGE / "backends").rglob("*.py"):
        assert not _imports(path) & {"loops", "trainer"}, path.name


def test_checkpoint_never_imports_the_optimizers():
    """The checkpoint folder reads and writes optimizer states as torch gives them; how trainwell builds optimizers
    (``trainwell/optim/``) is nothing it depends on."""
    for path in (PACKAGE / "checkpoint").rglob("*.py"):
        assert "optim" not in _imports(path), path.relative_to(PACKAGE.parent)


@pytest.mark.slow
def test_import_is_light():
    code = ("import sys, time; t=time.perf_counter(); import trainwell; "
            "heavy = [m for m in ('torch', 'numpy', 'deepspeed', 'transformers', 'datasets', 'tensorboard', "
            "'mlflow', 'optuna', 'sklearn', 'yaml', 'tqdm', 'wandb', 'comet_ml', 'clearml', 'neptune', 'dvclive', "
            "'codecarbon', 'trackio', 'swanlab', 'azureml', 'dagshub', 'flytekit', 'tensorflow', 'keras') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_trainer_import_pulls_no_optional_package():
    code = ("import sys; from trainwell import Trainer, TrainingArguments; "
            "print([m for m in ('deepspeed', 'transformers', 'datasets', 'tensorboard', 'mlflow', 'optuna', "
            "'sklearn', 'wandb', 'comet_ml', 'clearml', 'neptune', 'dvclive', 'codecarbon', 'trackio', 'swanlab', "
            "'azureml', 'dagshub', 'flytekit', 'tensorflow', 'keras') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_nothing_imports_the_tensorflow_subpackage():
    """trainwell.tf is optional (TensorFlow): no other module of the package may import it (but the file giving it
    its import path, ``trainwell/tf.py``)."""
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[:2] != ("compat", "tf") and path.relative_to(PACKAGE).parts != ("tf.py",):
            assert "compat.tf" not in {".".join(m.split(".")[:2]) for m in _imported_modules(path)}, \
                path.relative_to(PACKAGE.parent)


# -- import circles ----------------------------------------------------------------------------------------------


def _module_name(path: Path) -> str:
    """``trainwell/checkpoint/manager.py`` -> ``trainwell.checkpoint.manager`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (the condition of a block that only type checkers run)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` that runs, at import or in a function: the bodies of ``if TYPE_CHECKING:`` left out
    (their ``else`` runs)."""
    found: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))
    return found


def _module_imports(path: Path, me: str | None = None, *, type_only: bool = False) -> set[str]:
    """The trainwell modules ``path`` (the module ``me``) imports when it runs: module level and inside functions;
    not under ``if TYPE_CHECKING:`` (a type annotation's import is not a dependency at run time), unless
    ``type_only`` asks for those too.

    ``from .pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg`` (the package's
    ``__init__``). The packages above an imported module are not counted: their ``__init__`` runs first, but a
    package's ``__init__`` importing its own modules is how a package is built, not a circle.
    """
    me = me or _module_name(path)
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found: set[str] = set()
    tree = _parsed(path)
    for node in ast.walk(tree) if type_only else _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(package[: len(package) - node.level + 1] + (node.module or "").split("."))
                target = target.rstrip(".")
            elif node.module and node.module.split(".")[0] == "trainwell":
                target = node.module
            else:
                continue
            found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "trainwell")
    return {name for name in found if name in MODULES and name != me}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as ``[a, b, ..., a]``, or None (depth-first search, colouring the nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_circles():
    """No two modules import each other, directly or around a loop, not even through an import inside a function:
    a circle cut by a function-level import still ties the modules together. Put the shared piece in a module that
    both import (downward)."""
    cycle = _find_cycle({name: _module_imports(path) for name, path in MODULES.items()})
    assert cycle is None, "import circle: " + " -> ".join(cycle) + " (move what they share into a module both import)"


def test_no_import_circles_not_even_through_type_annotations():
    """A module naming another's class for the type checker only still depends on its shape: where two modules need
    each other's types, one takes a Protocol of what it uses (``trainer/dataloaders.py``'s ``DataTrainer``)."""
    graph = {name: _module_imports(path, type_only=True) for name, path in MODULES.items()}
    cycle = _find_cycle(graph)
    assert cycle is None, "import circle (type annotations included): " + " -> ".join(cycle)


def test_no_import_circles_between_packages():
    """The packages form no circle either (type annotations and function-level imports included): a piece two
    packages share lives in a package both import (``utils/trainer_state.py``, ``utils/secrets.py``)."""
    def package(name: str) -> str:
        return name.split(".")[1] if name.count(".") >= 1 else name

    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph.setdefault(package(name), set()).update(
            package(other) for other in _module_imports(path, type_only=True) if package(other) != package(name))
    for targets in list(graph.values()):
        for target in targets:
            graph.setdefault(target, set())
    cycle = _find_cycle(graph)
    assert cycle is None, "circle between packages: " + " -> ".join(cycle)


def test_the_circle_finder_finds_a_circle_through_a_function_level_import(tmp_path):
    """The guard above is not vacuous: a function-level import closing a loop is reported as that loop."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from .layout import CheckpointError\n    from . import commit\n")
    assert _module_imports(source, "trainwell.checkpoint.probe") == {"trainwell.checkpoint.layout",
                                                                       "trainwell.checkpoint.commit"}


def test_an_import_under_type_checking_is_no_dependency(tmp_path):
    """``if TYPE_CHECKING:`` imports are for annotations only: the circle finder leaves them out (their ``else``
    branch runs, so it counts)."""
    source = tmp_path / "probe.py"
    source.write_text("import typing\nfrom typing import TYPE_CHECKING\n"
                      "if TYPE_CHECKING:\n    from .layout import CheckpointError\n"
                      "if typing.TYPE_CHECKING:\n    from . import commit\nelse:\n    from . import digest\n"
                      "def f():\n    if TYPE_CHECKING:\n        from . import rng\n    from . import lock\n")
    assert _module_imports(source, "trainwell.checkpoint.probe") == {"trainwell.checkpoint.digest",
                                                                       "trainwell.checkpoint.lock"}


# -- size budgets ------------------------------------------------------------------------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
# Modules over the budget, each with why (trim this list when they are back within it).
LONG_MODULES: dict[str, str] = {
    "trainer/trainer.py": "the Trainer keeps every upstream method name users call and override: 92 methods, 72 of "
                          "them a docstring and a few lines delegating to a part (loops, dataloaders.py, "
                          "checkpointing/, hub.py...); a name cannot move out of the class users subclass",
    "data/collators.py": "upstream's collators and their exact random draws, with the fields gathered in C "
                         "(one pass per micro-batch); to split next (padding vs language modeling)",
}
# Functions over the budget, each with why.
LONG_FUNCTIONS: dict[str, str] = {
    "trainer/trainer.py:Trainer.__init__": "upstream's 14 constructor arguments and the attributes upstream sets "
                                          "from them, in upstream's order (the memory tracker measures the whole "
                                          "constructor); the checks are init_checks.py's, one call each",
}


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function and method in ``tree``, nested ones too."""
    found = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((prefix + node.name, node.end_lineno - node.lineno + 1))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
    return found


def test_modules_and_functions_stay_within_their_budgets():
    long_modules, long_functions = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules[rel] = len(text.splitlines())
        for name, lines in _functions(ast.parse(text)):
            if lines > MAX_FUNCTION_LINES:
                long_functions[f"{rel}:{name}"] = lines
    assert set(long_modules) <= set(LONG_MODULES), (
        f"modules over {MAX_MODULE_LINES} lines: { {k: v for k, v in long_modules.items() if k not in LONG_MODULES} }; "
        "split them by concern (or list one in LONG_MODULES with why)")
    assert set(long_functions) <= set(LONG_FUNCTIONS), (
        f"functions over {MAX_FUNCTION_LINES} lines: "
        f"{ {k: v for k, v in long_functions.items() if k not in LONG_FUNCTIONS} }; split them (or list one in "
        "LONG_FUNCTIONS with why)")
    stale = sorted((set(LONG_MODULES) - set(long_modules)) | (set(LONG_FUNCTIONS) - set(long_functions)))
    assert not stale, f"within budget now: remove {stale} from the exceptions of tests/test_architecture.py"


def test_the_top_level_shows_the_architecture():
    """At most 15 entries at the top of trainwell/: each a part of the architecture a newcomer can read."""
    entries = sorted(p.name for p in PACKAGE.iterdir()
                     if not p.name.startswith((".", "__pycache__")) and p.name not in UPSTREAM_NAMES)
    assert len(entries) <= 15, f"{len(entries)} entries at the top of trainwell/: {entries}; group them"


def _backend_getattrs(path: Path) -> list[str]:
    """``getattr(<x>.backend, ...)`` / ``hasattr(<x>.backend, ...)`` calls in ``path``: a hook found by name."""
    found = []
    for node in ast.walk(_parsed(path)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") \
                and node.args:
            target = node.args[0]
            if isinstance(target, ast.Attribute) and target.attr == "backend":
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def test_no_backend_hook_is_found_by_getattr():
    """Every hook a backend may provide is in the Backend Protocol (its default in the single-device backend), so
    callers call it; a ``getattr(trainer.backend, "hook", None)`` is a hook outside the contract."""
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in _backend_getattrs(path)]
    assert not found, f"backend hooks found by getattr (add them to trainwell.backends.base.Backend): {found}"


# -- who writes the Trainer's attributes ---------------------------------------------------------------------------
# The Trainer's attributes are assigned in trainer/trainer.py and in the run object's constructor (loops/run.py's
# TrainingRun, which installs the objects a run replaces: state, model, optimizer...); every other part returns a
# value, keeps its own state, or calls a Trainer method. ``control`` is upstream's: every callback event returns it
# and it is assigned where the event is called, as in upstream's loop; so is ``_past`` (the memory of ``past_index``
# models), which upstream's training and evaluation loops reset and set themselves.
TRAINER_WRITERS = {"trainer/trainer.py": None, "loops/run.py": "TrainingRun"}  # None: the whole module
UPSTREAM_WRITES = {"control", "_past"}
# Not state: ``prepare_trainer`` (trainwell.integrations.ray_train, as Ray's) gives the instance a subclass of its class.
CLASS_SWAP = {"__class__"}


def _is_trainer(node: ast.expr) -> bool:
    """``trainer``, ``local_trainer``, ``self.trainer`` or ``self._trainer`` (how the parts name the Trainer)."""
    if isinstance(node, ast.Name):
        return node.id in ("trainer", "local_trainer")
    return isinstance(node, ast.Attribute) and node.attr in ("trainer", "_trainer") \
        and isinstance(node.value, ast.Name) and node.value.id == "self"


def _trainer_writes(tree: ast.AST) -> set[str]:
    """Attributes assigned on the Trainer in ``tree``: ``trainer.x = ...`` (augmented, annotated and tuple targets
    too), ``setattr(trainer, "x", ...)`` and ``trainer.__dict__`` writes (reported as ``__dict__``)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") \
                and node.args and _is_trainer(node.args[0]):
            found.add(node.args[1].value if isinstance(node.args[1], ast.Constant) else "setattr")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "update", "pop", "setdefault", "__setitem__") and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr == "__dict__" and _is_trainer(node.func.value.value):
            found.add("__dict__")
        while targets:
            target = targets.pop()
            if isinstance(target, (ast.Tuple, ast.List)):
                targets.extend(target.elts)
            elif isinstance(target, ast.Attribute) and _is_trainer(target.value):
                found.add(target.attr)
            elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                    and target.value.attr == "__dict__" and _is_trainer(target.value.value):
                found.add("__dict__")
    return found - UPSTREAM_WRITES - CLASS_SWAP


def test_trainer_attributes_are_assigned_only_by_the_trainer_and_the_run_constructor():
    writes: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        if rel in TRAINER_WRITERS:
            if TRAINER_WRITERS[rel] is None:
                continue
            # the allowed class's methods are the constructor's steps: drop it and check the rest of the module
            tree.body = [node for node in tree.body
                         if not (isinstance(node, ast.ClassDef) and node.name == TRAINER_WRITERS[rel])]
        attrs = _trainer_writes(tree)
        if attrs:
            writes[rel] = sorted(attrs)
    assert not writes, (f"Trainer attributes assigned outside trainer/trainer.py and the run's constructor: {writes}; "
                        "return the value, keep it on the run (loops/run.py) or its LoopState, or add a Trainer "
                        "method that assigns it")


def test_the_writes_finder_sees_every_form_of_write():
    tree = ast.parse("def f(trainer, other, self):\n    trainer.a = 1\n    trainer.b += 2\n"
                     "    trainer.c, (trainer.d, x) = 1, (2, 3)\n    other.e = 4\n    trainer.control = 5\n"
                     "    trainer.f: int = 6\n    setattr(trainer, 'g', 7)\n    self._trainer.h = 8\n"
                     "    self.trainer.i = 9\n    trainer.__dict__.update(j=10)\n    self.other.k = 11\n")
    assert _trainer_writes(tree) == {"a", "b", "c", "d", "f", "g", "h", "i", "__dict__"}


# -- imports inside functions ------------------------------------------------------------------------------------
# A module imports what it uses at its top, where a reader sees its dependencies, unless the import must wait for
# the function: the modules ``from trainwell import Trainer`` loads (their lazy imports keep the import light, see
# tests/test_overhead_guard.py), the command line's start-up, optional packages, and the exceptions listed here.

# The names ``pip install trainwell`` always installs, by import name (pyproject's [project] dependencies).
_IMPORT_NAMES = {"pyyaml": "yaml"}


def _always_installed() -> set[str]:
    text = (PACKAGE.parent / "pyproject.toml").read_text()
    block = re.search(r"^\[project\].*?^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert block, "pyproject.toml: [project] dependencies not found"
    names = {re.match(r"[A-Za-z0-9_.-]+", dep).group(0).lower().replace("-", "_")
             for dep in re.findall(r'"([^"]+)"', block.group(1))}
    return {_IMPORT_NAMES.get(name, name) for name in names} | set(sys.stdlib_module_names) | {"trainwell"}


# Off the Trainer import path but loaded before a command needs torch: ``trainwell --help``, ``trainwell <command>
# --help``, ``trainwell train``'s checks of its arguments and output folder, ``trainwell plot``, TrainingArguments
# and its parser (tests/args: no torch, no yaml), ``trainwell.patch_transformers``. Their imports of anything but the
# standard library stay in the functions that need them.
LIGHT_MODULES: dict[str, str] = {
    "trainwell.__main__": "python -m trainwell",
    "trainwell.cli.main": "trainwell --help",
    "trainwell.cli.arguments": "trainwell --help",
    "trainwell.cli.output_dir_check": "trainwell train checks its output folder before it loads the Trainer",
    "trainwell.cli.recipes": "trainwell train --help",
    "trainwell.cli.recipes.config": "trainwell train --help (no yaml)",
    "trainwell.cli.commands.env": "trainwell env --help",
    "trainwell.cli.commands.generate": "trainwell generate --help",
    "trainwell.cli.commands.plot": "trainwell plot --help",
    "trainwell.cli.commands.run": "trainwell run --help",
    "trainwell.cli.commands.deepspeed_tools": "trainwell zero-to-fp32 / estimate-memory --help",
    "trainwell.backends.deepspeed.weights": "trainwell zero-to-fp32 --help",
    "trainwell.backends.deepspeed.memory_estimates": "trainwell estimate-memory --help",
    "trainwell.backends.deepspeed.config": "read by TrainingArguments (no torch)",
    "trainwell.checkpoint.layout": "trainwell train's output folder check, trainwell plot (no torch)",
    "trainwell.checkpoint.lock": "trainwell train's output folder check (no torch)",
    "trainwell.checkpoint.digest": "imported by checkpoint.layout (no torch)",
    "trainwell.args.parser": "ArgParser (tests/args/test_parser.py: no torch, no yaml)",
    "trainwell.args.seq2seq": "Seq2SeqTrainingArguments (no torch)",
    "trainwell.compat.patch": "trainwell.patch_transformers (no torch until it patches)",
}
# Imported in the functions that use them, in any module: what is heavy or not everywhere installed.
LAZY_PACKAGES: dict[str, str] = {
    "torch.distributed.fsdp": "about a second of imports (torch._dynamo), for FSDP runs only",
    "torch.distributed.tensor": "about a second of imports, for FSDP runs only",
    "torch.distributed.checkpoint": "about a second of imports, for FSDP checkpoints only",
    "torch.distributed.optim": "about a second of imports, for sharded_ddp only",
    "torch.distributed.device_mesh": "for FSDP runs only, where torch.distributed is available",
}
# (module, imported module, why the import stays in its function)
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("trainwell.compat.tf", "trainwell.compat.tf.trainer"): "module __getattr__: TFTrainer needs TensorFlow",
    ("trainwell.compat.tf", "trainwell.compat.tf.optimization"): "module __getattr__: needs TensorFlow",
    ("trainwell.data.flattening", "torch"): "only return_tensors='pt' needs torch; the numpy path stays torch-free",
    ("trainwell.loops.train_loop", "tqdm.auto"): "only a resume re-reading a stream's batches shows its bar "
                                                "(tqdm.auto probes for a notebook)",
    ("trainwell.checkpoint.store", "trainwell.checkpoint.commit"): "commit loads torch; the store module imports "
                                                                   "neither torch nor numpy (its docstring)",
}


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per session (the guards read every module several times; never mutate
    it)."""
    return ast.parse(path.read_text())


def _statements(node: ast.AST) -> list[ast.stmt]:
    """The statements directly inside ``node`` (imports are statements: expressions need no visit)."""
    found = []
    for field in ("body", "orelse", "finalbody", "handlers", "cases"):
        found.extend(getattr(node, field, None) or [])
    return found


def _import_time_modules(path: Path, me: str) -> set[str]:
    """The trainwell modules ``path`` imports when it is imported (not in functions, not ``if TYPE_CHECKING:``), and
    the packages above them (their ``__init__`` runs first)."""
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found: set[str] = set()
    stack: list[ast.AST] = [_parsed(path)]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = ".".join(package[: len(package) - node.level + 1] + (node.module or "").split(".")).rstrip(".")
            else:
                target = node.module or ""
            if target.split(".")[0] == "trainwell":
                found.update(f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "trainwell")
        stack.extend(_statements(node))
    parents = {".".join(name.split(".")[:end]) for name in found for end in range(1, name.count(".") + 1)}
    return {name for name in found | parents if name in MODULES and name != me}


def _trainer_import_path() -> set[str]:
    """The modules ``from trainwell import Trainer`` loads: ``trainwell/__init__.py`` and the Trainer's module, and
    what they import at import time, transitively."""
    seen: set[str] = set()
    todo = ["trainwell", "trainwell.trainer", "trainwell.trainer.trainer"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_import_time_modules(MODULES[name], name) - seen)
    return seen


def _catches_import_error(node: ast.Try) -> bool:
    return any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
               for h in node.handlers if h.type is not None for n in ast.walk(h.type))


def _function_level_imports(path: Path, me: str) -> list[tuple[int, str]]:
    """``(line, imported module)`` of the imports inside functions that run (``if TYPE_CHECKING:`` left out), but
    those inside a ``try`` that catches ImportError (a package that may be missing)."""
    if not re.search(r"^[ \t]+(?:import|from)\s", path.read_text(), re.M):
        return []
    package = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
    found: list[tuple[int, str]] = []
    stack: list[tuple[ast.AST, bool]] = [(_parsed(path), False)]
    while stack:
        node, in_function = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            children = node.orelse
        elif isinstance(node, ast.Try) and _catches_import_error(node):
            children = node.handlers + node.orelse + node.finalbody
        else:
            children = _statements(node)
        if in_function and isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + (node.module or "").split(".")).rstrip(".")
                found.extend((node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
                             for a in node.names)
            else:
                found.append((node.lineno, node.module or ""))
        elif in_function and isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        stack.extend((child, inner) for child in reversed(children))
    return sorted(found)


def test_imports_inside_functions_are_only_those_that_must_wait():
    """Off the Trainer's import path, a function imports a module of the standard library, of trainwell or of a
    package trainwell always installs only for a listed reason (LIGHT_MODULES, LAZY_PACKAGES, LAZY_IMPORTS); optional
    packages (the extras) stay in the functions that use them. Move a new one to the top of its module (or list it
    with why it must wait)."""
    installed = _always_installed()
    trainer_path = _trainer_import_path()
    offending, used = [], set()
    for name, path in MODULES.items():
        if name in trainer_path:
            continue
        for line, imported in _function_level_imports(path, name):
            root = imported.split(".")[0]
            if root not in installed:
                continue  # an optional package
            if name in LIGHT_MODULES and root not in sys.stdlib_module_names:
                continue
            lazy = [p for p in LAZY_PACKAGES if imported == p or imported.startswith(p + ".")]
            if lazy or (name, imported) in LAZY_IMPORTS:
                used.add((name, imported))
                used.update(lazy)
                continue
            offending.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {imported}")
    assert not offending, ("imports inside functions that belong at the top of their module:\n"
                           + "\n".join(dict.fromkeys(offending)))
    assert set(LAZY_IMPORTS) <= used, f"LAZY_IMPORTS no longer needed: {sorted(set(LAZY_IMPORTS) - used)}"
    assert set(LAZY_PACKAGES) <= used, f"LAZY_PACKAGES no longer needed: {sorted(set(LAZY_PACKAGES) - used)}"
    assert set(LIGHT_MODULES) <= set(MODULES), sorted(set(LIGHT_MODULES) - set(MODULES))


@pytest.mark.slow
def test_the_trainer_import_path_is_what_the_import_loads():
    """The static path above is the one Python takes (the check exempts exactly those modules)."""
    code = ("import sys; from trainwell import Trainer; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('trainwell'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout.split()
    assert set(out) == _trainer_import_path()


def test_the_function_import_finder_sees_what_it_must(tmp_path):
    """The check is not vacuous: imports in methods and nested functions count; TYPE_CHECKING and try/ImportError
    blocks, and module-level imports, do not."""
    source = tmp_path / "probe.py"
    source.write_text("import json\nfrom typing import TYPE_CHECKING\n"
                      "def f():\n    import os\n    from .layout import CheckpointError\n"
                      "    if TYPE_CHECKING:\n        import torch\n"
                      "    try:\n        import xxhash\n    except ImportError:\n        xxhash = None\n"
                      "    def g():\n        from . import commit\n"
                      "class C:\n    def m(self):\n        import numpy as np\n")
    assert _function_level_imports(source, "trainwell.checkpoint.probe") == [
        (4, "os"), (5, "trainwell.checkpoint.layout"), (13, "trainwell.checkpoint.commit"), (16, "numpy")]
