"""Nested outputs (tuples, lists, namedtuples, dicts of tensors or arrays): flatten, rebuild, map."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

_LEAF = ("leaf",)
_HALF = (torch.float16, torch.bfloat16)


def _flatten(obj: Any) -> tuple[list[Any], Any]:
    """Leaves of a nested tuple/list/dict, and a spec that :func:`_unflatten` turns back into the structure."""
    if isinstance(obj, Mapping):
        leaves: list[Any] = []
        children = []
        for key, value in obj.items():
            sub_leaves, sub_spec = _flatten(value)
            leaves.extend(sub_leaves)
            children.append((key, sub_spec))
        return leaves, ("map", tuple(children))
    if isinstance(obj, (tuple, list)):
        leaves, children = [], []
        for value in obj:
            sub_leaves, sub_spec = _flatten(value)
            leaves.extend(sub_leaves)
            children.append(sub_spec)
        kind = type(obj) if hasattr(obj, "_fields") else (list if isinstance(obj, list) else tuple)
        return leaves, ("seq", kind, tuple(children))
    return [obj], _LEAF


def _unflatten(spec: Any, leaves: Iterable[Any]) -> Any:
    """Rebuild the structure described by ``spec`` from ``leaves`` (in :func:`_flatten` order)."""
    return _build(spec, iter(leaves))


def _build(spec: Any, leaves: Iterator[Any]) -> Any:
    if spec[0] == "leaf":
        return next(leaves)
    if spec[0] == "map":
        return {key: _build(sub, leaves) for key, sub in spec[1]}
    kind, children = spec[1], spec[2]
    values = [_build(sub, leaves) for sub in children]
    if kind is list or kind is tuple:
        return kind(values)
    return kind(*values)  # a namedtuple


def nested_map(fn: Any, obj: Any) -> Any:
    """Apply ``fn`` to every leaf of a nested tuple/list/dict, keeping the structure."""
    leaves, spec = _flatten(obj)
    return _unflatten(spec, [fn(leaf) for leaf in leaves])


def nested_detach(obj: Any) -> Any:
    """Detach every tensor of a nested structure (other leaves are returned unchanged)."""
    return nested_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, obj)


def upcast_half(obj: Any) -> Any:
    """A model output with its float16/bfloat16 tensors as float32 (as accelerate's ``convert_to_fp32``).

    Tuples and lists are rebuilt (a namedtuple keeps its type); a mapping (a dict, a ``ModelOutput``) is updated in
    place, so its type and attribute access stay as the model made them (it is the forward pass's fresh output).
    """
    if isinstance(obj, torch.Tensor):
        return obj.float() if obj.dtype in _HALF else obj
    if isinstance(obj, MutableMapping):
        for key, value in list(obj.items()):
            new = upcast_half(value)
            if new is not value:
                obj[key] = new
        return obj
    if isinstance(obj, (tuple, list)):
        values = [upcast_half(value) for value in obj]
        if all(new is old for new, old in zip(values, obj)):
            return obj
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    return obj
