"""``lazy_exports``: the ``__getattr__``/``__dir__`` pair of a package whose public names live in its submodules.

A package lists ``{name: submodule}`` and gets the names imported on first use (PEP 562), so that importing the
package stays cheap (``import trainwell`` loads neither torch nor any optional package).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Mapping

__all__ = ["lazy_exports"]


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
