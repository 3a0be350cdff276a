"""The package's layering: a lower layer never imports a higher one, and importing trainwell stays light."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "trainwell"

# Each top-level module/package of trainwell and its layer; a module may import only from layers <= its own.
# A dotted key gives a module inside a package its own layer (the longest matching key wins).
LAYERS: dict[str, int] = {
    # foundations: no trainwell imports beyond layer 0
    "utils": 0, "callbacks.state": 0, "data": 0, "optim": 0, "cli.arguments": 0,
    "runtime.distributed": 0, "runtime.precision": 0, "runtime.memory": 0,
    # the DeepSpeed config is pure data, read by TrainingArguments
    "backends.deepspeed.config": 0,
    # configuration, events, the file format of checkpoints
    "args": 1, "runtime": 1, "callbacks.events": 1, "checkpoint": 1,
    # callbacks and execution backends (never the loops or the trainer)
    "callbacks": 2, "backends": 2, "args.seq2seq": 2,
    "loops": 3, "trainer.accelerator": 3,
    "trainer": 4, "hpsearch": 4,
    "trainer.seq2seq": 5,
    "cli": 6, "__main__": 6, "__init__": 6,
    "compat": 7,
}
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
    for node in ast.walk(ast.parse(path.read_text())):
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
    """trainwell.tf is optional (TensorFlow): no other module of the package may import it."""
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).parts[:2] != ("compat", "tf"):
            assert "compat.tf" not in {".".join(m.split(".")[:2]) for m in _imported_modules(path)}, \
                path.relative_to(PACKAGE.parent)


def _backend_getattrs(path: Path) -> list[str]:
    """``getattr(<x>.backend, ...)`` / ``hasattr(<x>.backend, ...)`` calls in ``path``: a hook found by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
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
