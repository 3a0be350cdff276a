"""What libraries built on ``transformers.Trainer`` use of it, read from their installed source (no import).

:func:`trainer_uses` walks every module of a package with ``ast``, finds the classes deriving from upstream's
``Trainer`` (directly, or through the package's own classes, imports resolved by name) and records, per method name
of ``transformers.Trainer``, where the library calls ``self.<name>(...)``, calls ``super().<name>(...)`` or
overrides it, with each call's shape (positional count, keyword names) to bind against trainwell's signature.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

#: upstream's trainer classes, as a library's source may name them (after its imports are resolved)
UPSTREAM_TRAINERS = {"transformers.Trainer", "transformers.trainer.Trainer", "transformers.Seq2SeqTrainer",
                     "transformers.trainer_seq2seq.Seq2SeqTrainer"}


@dataclass
class Use:
    """One name of upstream's Trainer as a library uses it."""

    name: str
    how: set[str] = field(default_factory=set)  # "self", "super", "override"
    where: set[str] = field(default_factory=set)  # "package.module.Class"
    calls: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (positional count, keyword names)


def _modules(package: str) -> dict[str, Path]:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return {}
    root = Path(list(spec.submodule_search_locations)[0])
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(tree: ast.Module, module: str, is_package: bool) -> dict[str, str]:
    """Local name -> dotted origin, for the module's ``import`` / ``from ... import`` statements (any depth)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")
                parent = parent if is_package else parent[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                names[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.asname and alias.name or alias.name.split(".")[0]
    return names


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def _classes(packages: tuple[str, ...]) -> dict[str, tuple[ast.ClassDef, list[str]]]:
    """``module.Class`` -> (its node, its bases resolved to dotted names) over every module of ``packages``."""
    out: dict[str, tuple[ast.ClassDef, list[str]]] = {}
    for package in packages:
        for module, path in _modules(package).items():
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imports = _imports(tree, module, path.name == "__init__.py")
            local = {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                bases = []
                for base in node.bases:
                    name = _dotted(base)
                    if name is None:
                        continue
                    head, _, rest = name.partition(".")
                    if head in local:
                        resolved = f"{module}.{name}"
                    elif head in imports:
                        resolved = imports[head] + (f".{rest}" if rest else "")
                    else:
                        resolved = name
                    bases.append(resolved)
                out[f"{module}.{node.name}"] = (node, bases)
    return out


def _reexports(packages: tuple[str, ...]) -> dict[str, str]:
    """``package.Name`` -> ``package.module.Name`` for names a package's ``__init__`` imports (one level)."""
    out = {}
    for package in packages:
        for module, path in _modules(package).items():
            if path.name != "__init__.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for local, origin in _imports(tree, module, True).items():
                out[f"{module}.{local}"] = origin
    return out


@functools.lru_cache(maxsize=None)
def trainer_classes(packages: tuple[str, ...]) -> dict[str, ast.ClassDef]:
    """Every class of ``packages`` deriving from upstream's Trainer, directly or through the packages' classes."""
    classes = _classes(packages)
    aliases = _reexports(packages)
    derived: set[str] = set()
    changed = True
    while changed:
        changed = False
        for qualname, (_, bases) in classes.items():
            if qualname in derived:
                continue
            for base in bases:
                base = aliases.get(base, base)
                if base in UPSTREAM_TRAINERS or base in derived:
                    derived.add(qualname)
                    changed = True
                    break
    return {name: classes[name][0] for name in sorted(derived)}


def _call_shape(call: ast.Call) -> tuple[int, tuple[str, ...]] | None:
    """(positional count, keyword names); None when ``*args``/``**kwargs`` make the shape unknown."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    return len(call.args), tuple(k.arg for k in call.keywords if k.arg is not None)


def trainer_uses(packages: tuple[str, ...], upstream_methods: set[str]) -> dict[str, Use]:
    """Per name of ``upstream_methods``: how the Trainer classes of ``packages`` call or override it."""
    uses: dict[str, Use] = {}

    def use(name: str, how: str, where: str) -> Use:
        entry = uses.setdefault(name, Use(name))
        entry.how.add(how)
        entry.where.add(where)
        return entry

    for qualname, node in trainer_classes(packages).items():
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in upstream_methods:
                use(item.name, "override", qualname)
        parents = {child: parent for parent in ast.walk(node) for child in ast.iter_child_nodes(parent)}
        for sub in ast.walk(node):
            if not isinstance(sub, ast.Attribute) or sub.attr not in upstream_methods:
                continue
            value = sub.value
            if isinstance(value, ast.Name) and value.id == "self":
                how = "self"
            elif (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"):
                how = "super"
            else:
                continue
            entry = use(sub.attr, how, qualname)
            parent = parents.get(sub)
            if isinstance(parent, ast.Call) and parent.func is sub:
                shape = _call_shape(parent)
                if shape is not None:
                    entry.calls.append(shape)
    return uses
