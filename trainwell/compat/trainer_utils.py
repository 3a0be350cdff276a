"""``trainwell.trainer_utils``, under upstream's module name (``transformers.trainer_utils``): the enums, outputs and
seeding helpers (defined in :mod:`trainwell.utils.trainer_utils`) and the helpers upstream keeps in this module while
trainwell keeps them with the code that uses them (resolved on first use, PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

_ELSEWHERE = {
    "get_last_checkpoint": "checkpoint.layout",
    "HPSearchBackend": "hpsearch",
    "default_compute_objective": "hpsearch",
    "default_hp_space_optuna": "hpsearch",
    "default_hp_space_ray": "hpsearch.ray",
    "speed_metrics": "utils.reporting",
    "denumpify_detensorize": "loops.eval_loop",
    "has_length": "data.loader",
}


def __getattr__(name: str) -> Any:
    module = _ELSEWHERE.get(name, "utils.trainer_utils")
    try:
        value = getattr(importlib.import_module(f"trainwell.{module}"), name)
    except AttributeError:
        raise AttributeError(f"module 'trainwell.trainer_utils' has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ELSEWHERE) | set(dir(importlib.import_module("trainwell.utils.trainer_utils"))))
