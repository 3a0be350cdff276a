"""The callbacks' states in a checkpoint (``TrainerState.stateful_callbacks``, upstream's format): export and restore.

Used by :class:`trainwell.trainer.checkpointing.checkpoints.TrainerCheckpoints` when it saves and resumes (loaded
there, not by ``import trainwell``).
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("trainwell.trainer.trainer")


def is_exportable(callback: Any) -> bool:
    """An ExportableState: trainwell's mixin, or a class written against upstream's (same name, same contract)."""
    return any(base.__name__ == "ExportableState" for base in type(callback).__mro__) and callable(
        getattr(callback, "state", None))


def export_callback_states(callbacks: list[Any], control: Any) -> dict[str, Any]:
    """``{class name: state()}`` (a list of states for several callbacks of one class), the control last."""
    exported: dict[str, Any] = {}
    for callback in [*callbacks, control]:
        if not is_exportable(callback):
            continue
        name, state = type(callback).__name__, callback.state()
        if name not in exported:
            exported[name] = state
        elif isinstance(exported[name], list):
            exported[name].append(state)
        else:
            exported[name] = [exported[name], state]
    return exported


def restore_callback_states(callbacks: list[Any], control: Any, saved: dict[str, Any]) -> Any:
    """Restore ``stateful_callbacks`` onto ``callbacks`` and ``control``; returns the control to use.

    Saved states are matched to the callbacks of the same class name, in order (the k-th saved state of a class
    goes to its k-th callback). Each callback is rebuilt from the saved constructor ``args`` (the new instance's
    fields are copied into the existing object, so references the user holds see the restored state), then the
    saved ``attributes`` are set, and it moves to the end of ``callbacks`` (in the checkpoint's order), where
    upstream's ``_load_callback_state`` adds the callbacks it rebuilt. States without a matching callback are
    reported and ignored.
    """
    exportable = [cb for cb in callbacks if is_exportable(cb)]
    not_found, restored = [], []
    for name, entries in saved.items():
        entries = entries if isinstance(entries, list) else [entries]
        if name == type(control).__name__:
            control = rebuilt(control, entries[0])
            continue
        targets = [cb for cb in exportable if type(cb).__name__ == name]
        if not targets:
            not_found.append(name)
        elif len(targets) != len(entries):
            logger.warning("The checkpoint holds %d states of %s but the trainer has %d such callbacks; restoring "
                           "the first %d in order", len(entries), name, len(targets), min(len(entries), len(targets)))
        for callback, entry in zip(targets, entries):
            restored.append(rebuilt(callback, entry))
    if restored:
        moved = {id(cb) for cb in restored}
        callbacks[:] = [cb for cb in callbacks if id(cb) not in moved] + restored
    if not_found:  # the names in the message itself (not a logging argument), as upstream's
        logger.warning("Checkpoint included callbacks not included in current configuration. Ignoring. (%s)"
                       % ", ".join(not_found))
    return control


def rebuilt(callback: Any, entry: dict[str, Any]) -> Any:
    """``callback`` with the constructor ``args`` and ``attributes`` of a saved ``state()`` applied; returns it."""
    args, attributes = entry.get("args") or {}, entry.get("attributes") or {}
    if args:
        try:
            fresh = type(callback)(**args)
        except TypeError as err:
            logger.warning("Cannot rebuild %s from the saved arguments %s (%s); restoring its attributes only",
                           type(callback).__name__, args, err)
        else:
            try:
                vars(callback).update(vars(fresh))
            except TypeError:  # no __dict__ (slots): set the constructor's fields one by one
                for key, value in args.items():
                    setattr(callback, key, value)
    for key, value in attributes.items():
        setattr(callback, key, value)
    return callback
