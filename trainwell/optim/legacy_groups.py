"""Load optimizer and schedule states saved by trainwell releases that dropped empty parameter groups.

The optimizer has upstream's two parameter groups ``[decay, no_decay]``, an empty one kept (a LoRA model whose
trainable weights all decay has ``[n, 0]``), so its state dicts are upstream's and interchange with it. Earlier
trainwell releases left an empty group out: their ``optimizer.pt`` of such a model has one group ``[n]`` and their
``scheduler.pt`` one entry per remaining group in its per-group lists (``base_lrs``, ``_last_lr``...).

The functions here put the missing empty groups back where this optimizer has them, so those checkpoints resume; a
state in any other layout is returned unchanged (and the caller's size check reports a real mismatch). Empty groups
hold no parameter, so numbering and every update stay the same.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["restore_dropped_groups", "restore_dropped_scheduler_entries"]

# The per-group lists of torch's schedulers (LambdaLR, ReduceLROnPlateau, CyclicLR, OneCycleLR...).
_PER_GROUP_SCHEDULER_KEYS = ("base_lrs", "_last_lr", "lr_lambdas", "min_lrs", "max_lrs")


def _empty_positions(optimizer: torch.optim.Optimizer, saved_count: int) -> list[int] | None:
    """Indices of ``optimizer``'s empty groups when dropping them leaves ``saved_count`` groups (else None)."""
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list):
        return None
    empty = [i for i, group in enumerate(groups) if not group["params"]]
    if not empty or len(groups) - len(empty) != saved_count:
        return None
    return empty


def _insert_at(values: list[Any], positions: list[int], make: Any) -> list[Any]:
    """``values`` with ``make(i)`` inserted so that it lands at each index ``i`` of ``positions`` (ascending)."""
    out = list(values)
    for index in positions:
        out.insert(index, make(index))
    return out


def restore_dropped_groups(saved: Any, optimizer: torch.optim.Optimizer) -> Any:
    """``saved`` (an optimizer state dict) with the empty groups of ``optimizer`` it lacks put back, each with
    ``optimizer``'s hyper-parameters for that group; ``saved`` unchanged when its groups are not exactly
    ``optimizer``'s non-empty ones."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list):
        return saved
    positions = _empty_positions(optimizer, len(groups))
    if positions is None:
        return saved
    kept = [group for group in optimizer.param_groups if group["params"]]
    if [len(g["params"]) for g in groups] != [len(g["params"]) for g in kept]:
        return saved

    def empty_group(index: int) -> dict[str, Any]:
        group = {k: v for k, v in optimizer.param_groups[index].items() if k != "params"}
        return {**group, "params": []}

    return {**saved, "param_groups": _insert_at(groups, positions, empty_group)}


def restore_dropped_scheduler_entries(saved: Any, scheduler: Any) -> Any:
    """``saved`` (a scheduler state dict) with an entry added to each per-group list for every empty group of the
    scheduler's optimizer that it lacks (the group's current value; ``None`` for ``lr_lambdas``, which keeps the
    current function); ``saved`` unchanged when its lists have one entry per group already."""
    if not isinstance(saved, dict):
        return saved
    optimizer = getattr(scheduler, "optimizer", None)
    lengths = {len(saved[k]) for k in _PER_GROUP_SCHEDULER_KEYS if isinstance(saved.get(k), list)}
    if len(lengths) != 1 or optimizer is None:
        return saved
    positions = _empty_positions(optimizer, lengths.pop())
    if positions is None:
        return saved
    restored = dict(saved)
    for key in _PER_GROUP_SCHEDULER_KEYS:
        if isinstance(saved.get(key), list):
            restored[key] = _insert_at(saved[key], positions, lambda i, key=key: _entry(scheduler, saved, key, i))
    return restored


def _entry(scheduler: Any, saved: dict[str, Any], key: str, index: int) -> Any:
    """The value for the restored empty group ``index`` in the per-group list ``key``."""
    if key == "lr_lambdas":
        return None  # torch's load_state_dict keeps the current function for None
    current = getattr(scheduler, key, None)
    return current[index] if isinstance(current, list) and len(current) > index else saved[key][0]
