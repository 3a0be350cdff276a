"""One torch parameter group where upstream keeps several equal ones, with upstream's groups in every state dict.

Upstream's Trainer always builds two parameter groups (the weights that get ``weight_decay`` and the ones that never
do), even when ``weight_decay`` is 0 and both groups hold the same hyper-parameters. torch's optimizers pay a fixed
Python cost per group and step (AdamW: about 2 % of a small model's step on the CPU), so when the groups are equal
trainwell runs them as one group whose parameters are the groups' parameters in order. The optimizer then numbers its
parameters exactly as the two groups would, and every parameter's update is the same.

What is saved keeps upstream's layout, so checkpoints interchange with the upstream Trainer in both directions:

- the optimizer's own ``state_dict()`` splits the group back into the logical groups, and its ``load_state_dict()``
  merges upstream's equal groups into one (torch's state-dict hooks, so every caller sees the same layout);
- :func:`scheduler_state_dict` / :func:`load_scheduler_state_dict` do the same for the schedule's per-group lists
  (``base_lrs``, ``_last_lr``, ``lr_lambdas``, ...), which torch's schedulers have no hooks for.
"""

from __future__ import annotations

import weakref
from typing import Any, Sequence

import torch

__all__ = [
    "merge_equal_groups", "logical_group_sizes", "logical_param_groups", "scheduler_state_dict",
    "load_scheduler_state_dict", "GroupLayoutError", "keep_logical_layout", "check_loadable",
    "check_scheduler_loadable",
]

# The per-group lists of torch's schedulers (LambdaLR, ReduceLROnPlateau, CyclicLR, ...).
_PER_GROUP_SCHEDULER_KEYS = frozenset({"base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs"})

# optimizer -> the sizes of the logical groups its one group stands for (kept off the optimizer's own attributes)
_SIZES: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, ...]] = weakref.WeakKeyDictionary()


class GroupLayoutError(ValueError):
    """A saved state that the merged optimizer cannot hold (its groups' hyper-parameters differ)."""


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k not in ("params", "param_names")}


def merge_equal_groups(groups: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], tuple[int, ...] | None]:
    """``groups`` as one group when there are several and their hyper-parameters are equal (else unchanged), and the
    sizes of the groups it stands for (None when nothing was merged). Install the layout on the optimizer built from
    the result with :func:`keep_logical_layout`."""
    if len(groups) < 2 or any(_hyper(group) != _hyper(groups[0]) for group in groups[1:]):
        return list(groups), None
    merged = {**_hyper(groups[0]), "params": [p for group in groups for p in group["params"]]}
    return [merged], tuple(len(group["params"]) for group in groups)


def keep_logical_layout(optimizer: torch.optim.Optimizer, sizes: tuple[int, ...]) -> None:
    """Make ``optimizer`` (one group built by :func:`merge_equal_groups`) save and load the groups of ``sizes``."""
    _SIZES[optimizer] = sizes
    optimizer.register_state_dict_post_hook(_split_state)
    optimizer.register_load_state_dict_pre_hook(_merge_state)


def logical_group_sizes(optimizer: Any) -> tuple[int, ...] | None:
    """The sizes of the groups ``optimizer``'s one group stands for; None when it was not merged."""
    try:
        return _SIZES.get(optimizer)
    except TypeError:  # not weak-referenceable: never merged
        return None


def logical_param_groups(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """The optimizer's parameter groups as upstream would have them (new dicts when it was merged)."""
    sizes = logical_group_sizes(optimizer)
    if sizes is None:
        return list(optimizer.param_groups)
    (group,) = optimizer.param_groups
    params, start, out = group["params"], 0, []
    for size in sizes:
        out.append({**group, "params": params[start:start + size]})
        start += size
    return out


def _split_state(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    sizes = _SIZES.get(optimizer)
    if sizes is None or len(state_dict["param_groups"]) != 1:
        return state_dict
    (group,) = state_dict["param_groups"]
    groups, start = [], 0
    for size in sizes:
        groups.append({**group, "params": group["params"][start:start + size]})
        start += size
    return {**state_dict, "param_groups": groups}


def _merge_state(optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
    sizes = _SIZES.get(optimizer)
    groups = state_dict.get("param_groups")
    if sizes is None or not isinstance(groups, list) or len(groups) == 1:
        return state_dict
    check_loadable(optimizer, groups)
    merged = {**groups[0], "params": [index for group in groups for index in group["params"]]}
    return {**state_dict, "param_groups": [merged]}


def check_loadable(optimizer: torch.optim.Optimizer, saved_groups: Sequence[dict[str, Any]]) -> None:
    """Raise :class:`GroupLayoutError` when ``saved_groups`` (a state dict's) cannot be loaded into ``optimizer``'s
    one group: their hyper-parameters differ (a checkpoint of another ``weight_decay``)."""
    sizes = _SIZES.get(optimizer)
    if sizes is None or len(saved_groups) != len(sizes):
        return  # the sizes check of the caller (or torch's own) reports a different number of groups
    first = _hyper(saved_groups[0])
    for group in saved_groups[1:]:
        differing = sorted(k for k in set(first) | set(_hyper(group)) if first.get(k) != group.get(k))
        if differing:
            raise GroupLayoutError(
                f"the saved optimizer's parameter groups differ in {', '.join(differing)} "
                f"({[first.get(k) for k in differing]} vs {[group.get(k) for k in differing]}), but this run's "
                "arguments make them equal, so its optimizer runs them as one group; resume with the arguments the "
                "checkpoint was written with (e.g. the same weight_decay)")


def scheduler_state_dict(scheduler: Any) -> dict[str, Any]:
    """``scheduler.state_dict()`` with one entry per logical group in its per-group lists (upstream's layout)."""
    state = scheduler.state_dict()
    sizes = logical_group_sizes(getattr(scheduler, "optimizer", None))
    if sizes is None:
        return state
    return {k: (list(v) * len(sizes) if k in _PER_GROUP_SCHEDULER_KEYS and isinstance(v, list) and len(v) == 1
                else v) for k, v in state.items()}


def load_scheduler_state_dict(scheduler: Any, state: dict[str, Any]) -> None:
    """``scheduler.load_state_dict(state)``, folding upstream's equal per-group entries into the merged group's one;
    raises :class:`GroupLayoutError` when they differ (:func:`check_scheduler_loadable` says so beforehand)."""
    scheduler.load_state_dict(_fold_scheduler_state(scheduler, state))


def check_scheduler_loadable(scheduler: Any, state: Any) -> None:
    """Raise :class:`GroupLayoutError` when ``state`` cannot be loaded into ``scheduler`` of a merged optimizer."""
    _fold_scheduler_state(scheduler, state)


def _fold_scheduler_state(scheduler: Any, state: Any) -> Any:
    sizes = logical_group_sizes(getattr(scheduler, "optimizer", None))
    if sizes is None or not isinstance(state, dict):
        return state
    folded = {}
    for key, value in state.items():
        if key in _PER_GROUP_SCHEDULER_KEYS and isinstance(value, list) and len(value) == len(sizes):
            if any(entry != value[0] for entry in value[1:]):
                raise GroupLayoutError(
                    f"the saved schedule's {key} differ between parameter groups ({value}), but this run's "
                    "optimizer runs its groups as one; resume with the arguments the checkpoint was written with")
            value = value[:1]
        folded[key] = value
    return folded
