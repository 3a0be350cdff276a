"""Training state and control flags shared by the trainer, the loops and the callbacks.

``TrainerState`` is the part of a run that is saved in every checkpoint (``trainer_state.json``);
``TrainerControl`` holds the flags with which callbacks steer the loop (log, evaluate, save, stop).
Both keep the upstream ``transformers`` field names so that user callbacks port unchanged.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ExportableState", "TrainerControl", "TrainerState", "trainer_state_problems"]


class ExportableState:
    """Mixin for objects (callbacks, the control) whose state is saved in checkpoints.

    ``state()`` returns ``{"args": {...}, "attributes": {...}}``: ``args`` are the constructor keyword
    arguments and ``attributes`` the fields to set on the rebuilt instance. ``from_state`` reverses it.
    """

    def state(self) -> dict[str, dict[str, Any]]:
        """Return ``{"args": constructor kwargs, "attributes": attributes to restore}``."""
        raise NotImplementedError(
            f"{type(self).__name__} inherits ExportableState but does not implement `state()`; "
            "define it to return {'args': {...}, 'attributes': {...}}."
        )

    @classmethod
    def from_state(cls, state: dict[str, dict[str, Any]]) -> ExportableState:
        """Rebuild an instance from the dict returned by :meth:`state`."""
        instance = cls(**state.get("args", {}))
        for name, value in state.get("attributes", {}).items():
            setattr(instance, name, value)
        return instance


def _export_callbacks(callbacks: list[Any]) -> dict[str, Any]:
    """Turn a list of stateful callbacks into ``{class name: state}`` (a list of states for repeats)."""
    exported: dict[str, Any] = {}
    for callback in callbacks:
        if not isinstance(callback, ExportableState):
            raise TypeError(
                f"stateful_callbacks got {type(callback).__name__}, which does not inherit "
                "trainwell.utils.trainer_state.ExportableState; add the mixin and implement `state()`, or leave it out."
            )
        name = type(callback).__name__
        if name not in exported:
            exported[name] = callback.state()
        elif isinstance(exported[name], list):
            exported[name].append(callback.state())
        else:
            exported[name] = [exported[name], callback.state()]
    return exported


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional(check: Any) -> Any:
    return lambda value: value is None or check(value)


def _is_callback_state(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(value.get(k, {}), dict) for k in ("args", "attributes"))


def _is_callback_states(value: Any) -> bool:
    return isinstance(value, dict) and all(
        _is_callback_state(entry) or (isinstance(entry, list) and all(_is_callback_state(e) for e in entry))
        for entry in value.values())


# Field -> (check, what it must be). The types are those upstream's TrainerState writes.
_SCHEMA: dict[str, tuple[Any, str]] = {
    "epoch": (_optional(_is_number), "a number or null"),
    "global_step": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "max_steps": (_is_int, "an integer"),
    "logging_steps": (_is_number, "a number"),
    "eval_steps": (_is_number, "a number"),
    "save_steps": (_is_number, "a number"),
    "train_batch_size": (_optional(_is_int), "an integer or null"),
    "num_train_epochs": (_is_number, "a number"),
    "num_input_tokens_seen": (_is_number, "a number"),
    "total_flos": (_is_number, "a number"),
    "log_history": (_optional(lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v)),
                    "a list of objects"),
    "best_metric": (_optional(_is_number), "a number or null"),
    "best_global_step": (_optional(_is_int), "an integer or null"),
    "best_model_checkpoint": (_optional(lambda v: isinstance(v, str)), "a string or null"),
    "is_local_process_zero": (lambda v: isinstance(v, bool), "true or false"),
    "is_world_process_zero": (lambda v: isinstance(v, bool), "true or false"),
    "is_hyper_param_search": (lambda v: isinstance(v, bool), "true or false"),
    "trial_name": (_optional(lambda v: isinstance(v, str)), "a string or null"),
    "trial_params": (_optional(lambda v: isinstance(v, dict)), "an object or null"),
    "stateful_callbacks": (_optional(_is_callback_states),
                           'an object {class name: {"args": {...}, "attributes": {...}} or a list of them}'),
}


def trainer_state_problems(data: Any) -> list[str]:
    """What is wrong with ``data`` (parsed ``trainer_state.json``) as a TrainerState; ``[]`` when it is valid.

    Keys this version does not know are allowed (a newer upstream may add some); known keys must hold the type
    upstream writes, so a damaged or hand-edited file is refused before anything is restored from the checkpoint.
    """
    if not isinstance(data, dict):
        return [f"expected a JSON object of TrainerState fields, found {type(data).__name__}"]
    problems = [f"{key!r} must be {what}, found {data[key]!r:.60}"
                for key, (check, what) in _SCHEMA.items() if key in data and not check(data[key])]
    if "global_step" not in data:
        problems.append("'global_step' is missing")
    return problems


@dataclass
class TrainerState:
    """Where a training run stands; saved as ``trainer_state.json`` in each checkpoint.

    ``epoch`` is fractional (``1.5`` = half-way through the second epoch); ``global_step`` counts
    optimizer steps. ``logging_steps``/``eval_steps``/``save_steps`` are the integer intervals the
    run uses (``compute_steps`` turns fractional arguments into step counts). ``log_history`` holds
    every dict that was logged. ``stateful_callbacks`` may be given as a list of
    :class:`ExportableState` callbacks and is stored as ``{class name: state}``.
    """

    epoch: float | None = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: int | None = None
    num_train_epochs: int | float = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list[dict[str, Any]] = field(default_factory=list)
    best_metric: float | None = None
    best_global_step: int | None = None
    best_model_checkpoint: str | None = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: str | None = None
    trial_params: dict[str, Any] | None = None
    stateful_callbacks: Any = None

    def __post_init__(self) -> None:
        if self.log_history is None:
            self.log_history = []
        if self.stateful_callbacks is None:
            self.stateful_callbacks = {}
        elif not isinstance(self.stateful_callbacks, dict):
            self.stateful_callbacks = _export_callbacks(list(self.stateful_callbacks))

    def to_dict(self) -> dict[str, Any]:
        """Return the state as a plain (json-serialisable) dict."""
        return dataclasses.asdict(self)

    def save_to_json(self, json_path: str | os.PathLike) -> None:
        """Write the state to ``json_path`` (indented, sorted keys, trailing newline)."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        with open(json_path, "w", encoding="utf-8") as handle:
            handle.write(text)

    @classmethod
    def load_from_json(cls, json_path: str | os.PathLike) -> TrainerState:
        """Read a state written by :meth:`save_to_json` (or upstream's); keys this version does not know are ignored.

        Raises ValueError naming the file when it is not valid JSON or its fields have the wrong types.
        """
        try:
            with open(json_path, encoding="utf-8") as handle:
                data = json.load(handle)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{os.fspath(json_path)} is not valid json ({err}); the checkpoint's trainer_state.json "
                "is damaged: resume from another checkpoint."
            ) from err
        problems = trainer_state_problems(data)
        if problems:
            raise ValueError(f"{os.fspath(json_path)} is not a valid trainer state ({'; '.join(problems)}); "
                             "resume from another checkpoint or fix the file.")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})

    def compute_steps(self, args: Any, max_steps: int) -> None:
        """Set ``logging_steps``/``eval_steps``/``save_steps`` from ``args``.

        A value below 1 is a ratio of ``max_steps`` (``ceil(max_steps * ratio)``); ``None`` keeps the
        current value (``eval_steps=None`` upstream means "same as logging_steps", which the
        arguments resolve before training).
        """
        for kind in ("logging", "eval", "save"):
            num_steps = getattr(args, f"{kind}_steps", None)
            if num_steps is None:
                continue
            if num_steps < 1:
                num_steps = math.ceil(max_steps * num_steps)
            setattr(self, f"{kind}_steps", int(num_steps))


@dataclass
class TrainerControl(ExportableState):
    """Flags that callbacks set to steer the training loop.

    The loop resets them at the documented points: ``should_training_stop`` at train begin,
    ``should_epoch_stop`` at each epoch begin, and ``should_log``/``should_evaluate``/``should_save``
    at each step begin and after the corresponding action ran.
    """

    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False

    def _new_training(self) -> None:
        """Reset the flag that ends training."""
        self.should_training_stop = False

    def _new_epoch(self) -> None:
        """Reset the flag that ends the current epoch."""
        self.should_epoch_stop = False

    def _new_step(self) -> None:
        """Reset the per-step action flags."""
        self.should_save = False
        self.should_evaluate = False
        self.should_log = False

    def state(self) -> dict[str, dict[str, Any]]:
        """Return the flags as ``{"args": {...}, "attributes": {}}`` (see :class:`ExportableState`)."""
        return {"args": dataclasses.asdict(self), "attributes": {}}
