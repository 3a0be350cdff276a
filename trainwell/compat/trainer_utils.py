"""``trainwell.trainer_utils``, under upstream's module name (``transformers.trainer_utils``): upstream's names from
the modules that hold them in trainwell (the option enums, the result tuples, seeding, checkpoint names, and the
helpers trainwell keeps with the code that uses them), each resolved on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

# Each home module (relative to trainwell) and the names this module gives from it.
_HOMES: dict[str, tuple[str, ...]] = {
    "utils.option_enums": ("ExplicitEnum", "IntervalStrategy", "EvaluationStrategy", "SaveStrategy", "HubStrategy",
                           "SchedulerType", "OptimizerNames", "ParallelMode", "FSDPOption", "ShardedDDPOption"),
    "utils.outputs": ("TrainOutput", "EvalPrediction", "EvalLoopOutput", "PredictionOutput", "BestRun"),
    "utils.seeding": ("set_seed", "enable_full_determinism", "seed_worker"),
    "utils.checkpoint_names": ("PREFIX_CHECKPOINT_DIR", "is_checkpoint_name"),
    "checkpoint.layout": ("get_last_checkpoint",),
    "hpsearch": ("HPSearchBackend", "default_compute_objective", "default_hp_space_optuna"),
    "hpsearch.ray": ("default_hp_space_ray",),
    "utils.reporting": ("speed_metrics",),
    "loops.eval_loop": ("denumpify_detensorize",),
    "data.loader": ("has_length",),
    "data.columns": ("RemoveColumnsCollator",),
    "runtime.memory": ("TrainerMemoryTracker",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trainwell.trainer_utils' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainwell.{_HOME[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
