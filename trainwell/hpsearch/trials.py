"""A trial's arguments: a validated copy of the Trainer's ``TrainingArguments`` with the trial's values.

Shared by every search engine (Optuna in :mod:`trainwell.hpsearch`, Ray Tune in :mod:`.ray`) and by
``Trainer.train(trial=dict)``.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

__all__ = ["FIXED_AT_INIT", "trial_arguments"]

# Arguments read when the Trainer is built (backend, precision, devices, reporting callbacks): a trial cannot change
# them, so a search space that sets one is refused rather than silently ignored.
FIXED_AT_INIT = frozenset({
    "deepspeed", "fsdp", "fsdp_config", "fp16", "bf16", "half_precision_backend", "use_cpu", "no_cuda",
    "local_rank", "ddp_backend", "report_to", "skip_memory_metrics", "place_model_on_device", "disable_tqdm",
})


def _coerce(name: str, annotation: Any, value: Any) -> Any:
    """``value`` in the declared type of a plain ``int``/``float`` field (an int search over a float field, and back)."""
    declared = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if declared == "float" and isinstance(value, int):
        return float(value)
    if declared == "int" and isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"hp_space: {name}={value} must be a whole number (the argument is an int); "
                             "use trial.suggest_int for it")
        return int(value)
    return value


def trial_arguments(args: Any, overrides: Mapping[str, Any], run_dir: str, *,
                    source: str = "hp_space returned") -> Any:
    """A validated copy of ``args`` with ``overrides`` applied and ``output_dir=run_dir`` (``args`` is untouched).

    ``source`` starts the error messages (what handed over the overrides)."""
    fields = {f.name: f.type for f in dataclasses.fields(args) if f.init}
    for key in overrides:
        if key not in fields:
            close = difflib.get_close_matches(str(key), sorted(fields), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AttributeError(f"{source} {key!r}, which is not a field of {type(args).__name__}"
                                 f"{hint}; return only TrainingArguments field names")
        if key in FIXED_AT_INIT:
            raise ValueError(f"{source} {key!r}, which is read when the Trainer is built and cannot change "
                             "per trial; set it in the TrainingArguments you pass to the Trainer instead")
    values = {key: _coerce(key, fields[key], value) for key, value in overrides.items()}
    values["output_dir"] = run_dir
    return dataclasses.replace(args, **values)


class SearchTrainer(Protocol):
    """What a search uses of the Trainer it runs the trials of (the search never imports the Trainer: the Trainer
    calls the search and passes itself, with the scope that puts its own arguments, model and state back)."""

    args: Any
    model_init: Callable[..., Any] | None
    callback_handler: Any
    control: Any
    state: Any
    _memory_tracker: Any

    def train(self, resume_from_checkpoint: Any = None, trial: Any = None, **kwargs: Any) -> Any: ...

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]: ...

    def _adopt_arguments(self, args: Any) -> None: ...


#: ``scope(without_model=False)``: a block after which the Trainer's arguments, model, state... are its own again.
SearchScope = Callable[..., AbstractContextManager[None]]

