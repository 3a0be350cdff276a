"""Call a (possibly user-overridden) Trainer method with only the arguments its signature accepts.

Upstream added arguments to overridable methods over the years (``compute_loss(..., num_items_in_batch)``,
``training_step(model, inputs, num_items_in_batch)``, ``create_scheduler(num_training_steps, optimizer)``,
``log(logs, start_time)``...). A subclass written for an older signature must keep working, so the Trainer and the
loops call such methods through :func:`call_override`: the method's signature is read once per function (so a
later monkey-patch is seen) and the call passes the leading positional arguments and the
keyword arguments it accepts, and drops the others.

Only arguments that are optional by contract (added later upstream, with a default that means "not given") may be
dropped this way; callers put them last.
"""

from __future__ import annotations

import inspect
import weakref
from dataclasses import dataclass
from typing import Any

# What each function accepts, read once per function (weak keys: a function redefined or dropped goes with its entry).
_SIGNATURES: weakref.WeakKeyDictionary[Any, Accepts] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Accepts:
    """What a callable takes: the number of positional parameters and the keyword names (None: unlimited)."""

    positional: int | None
    names: frozenset[str] | None

    def takes(self, name: str) -> bool:
        """Whether ``name`` can be passed as a keyword argument."""
        return self.names is None or name in self.names


def signature_accepts(fn: Any) -> Accepts:
    """Read ``fn``'s signature (a bound method's, without ``self``)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable without a signature: pass everything
        return Accepts(None, None)
    var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    names = frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return Accepts(None if var_positional else positional, None if var_keyword else names)


def _spec(method: Any) -> Accepts:
    key = getattr(method, "__func__", method)
    try:  # the hit is the common case (called per micro-batch): one lookup, no allocation
        return _SIGNATURES[key]
    except KeyError:
        spec = _SIGNATURES[key] = signature_accepts(method)
        return spec
    except TypeError:  # a callable that takes no weak reference: read every time
        return signature_accepts(method)


def accepts(obj: Any, name: str) -> Accepts:
    """What ``obj.<name>`` accepts (its function's signature, read once per function)."""
    return _spec(getattr(obj, name))


def call_override(obj: Any, name: str, /, *args: Any, **kwargs: Any) -> Any:
    """``obj.<name>(*args, **kwargs)`` without the trailing positional and keyword arguments it does not accept."""
    method = getattr(obj, name)
    spec = _spec(method)
    if spec.positional is not None and len(args) > spec.positional:
        args = args[:spec.positional]
    if spec.names is not None and kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k in spec.names}
    return method(*args, **kwargs)
