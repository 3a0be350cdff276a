"""``lazy_exports``: the ``__getattr__``/``__dir__`` pair of a package whose public names live in its submodules.

A package lists ``{name: submodule}`` and gets the names imported on first use (PEP 562), so that importing the
package stays cheap (``import trainwell`` loads neither torch nor any optional package).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
from types import ModuleType
from typing import Any, Callable, Mapping

__all__ = ["alias_modules", "lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``): ``exports`` maps each public name to the
    submodule (relative to the package) defining it. A name is imported once, then cached in the package."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__


class _AliasLoader:
    """Loads an alias by importing its target: both names then refer to the same module object."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system stamped the alias's spec on the shared module: undo it


class _AliasFinder:
    """Resolves ``package.<old>[.<sub>]`` to ``package.<new>[.<sub>]`` for the modules that moved."""

    def __init__(self, package: str, aliases: Mapping[str, str]) -> None:
        self.prefix = package + "."
        self.package = package
        self.aliases = dict(aliases)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self.prefix):
            return None
        parts = fullname[len(self.prefix):].split(".")
        for end in range(len(parts), 0, -1):
            new = self.aliases.get(".".join(parts[:end]))
            if new is not None:
                real = ".".join([self.package, new, *parts[end:]])
                return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))
        return None


def alias_modules(package: str, aliases: Mapping[str, str]) -> None:
    """Keep former module paths importable: ``import package.old`` gives the module now at ``package.new`` (the same
    object, so a monkeypatch through either name reaches the code). ``aliases`` maps old to new dotted names, relative
    to ``package``; a submodule of an aliased package follows it."""
    if not any(isinstance(f, _AliasFinder) and f.package == package for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(package, aliases))
