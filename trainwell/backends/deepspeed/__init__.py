"""DeepSpeed, in one package: one module per part; ``deepspeed`` itself is imported only by the functions using it.

- :mod:`.config`: the DeepSpeed config as pure data: loading, ``"auto"`` values filled from ``TrainingArguments``,
  mismatch detection, the live ZeRO-3 flag (``DeepSpeedConfig``, alias ``HfDeepSpeedConfig``,
  ``is_deepspeed_zero3_enabled``). No torch, no process group: ``TrainingArguments`` uses it.
- :mod:`.backend`: ``DeepSpeedBackend``, the engine behind trainwell's ``Backend`` interface (built by
  ``backends.registry``), and the check of DeepSpeed's checkpoint files before a resume.
- :mod:`.weights`: getting the weights out of ZeRO checkpoints (``zero_to_fp32``, ``trainwell zero-to-fp32``).
- :mod:`.memory_estimates`: ZeRO-2/3 memory needs per CPU and GPU (``estimate_zero_memory``,
  ``trainwell estimate-memory``).

Every public name of these modules can be imported from this package; they are resolved lazily, so that importing
the config does not import the engine. :func:`import_deepspeed_module` is the one place that imports ``deepspeed``
for the engine and for the weights (it selects DeepSpeed's CPU accelerator first where there is no GPU).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_MODULES = {
    "config": ("AUTO", "DS_TO_TRAINER_SCHEDULER", "DeepSpeedConfig", "HfDeepSpeedConfig", "get_deepspeed_config",
               "infer_hidden_size", "is_deepspeed_zero3_enabled", "load_deepspeed_config", "remaining_auto_keys",
               "resolve_deepspeed_config", "set_deepspeed_config", "unset_deepspeed_config"),
    "backend": ("DeepSpeedBackend", "check_deepspeed_files", "ensure_process_group", "import_deepspeed"),
    "weights": ("get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
                "zero_to_fp32"),
    "memory_estimates": ("BUFFER_FACTOR", "MemoryEstimate", "estimate_zero_memory",
                         "estimate_zero_memory_for_model", "format_memory_table"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def import_deepspeed_module(name: str, *, on_cpu: bool, missing: str) -> Any:
    """Import ``name`` (``deepspeed`` or one of its modules) and return it; when ``on_cpu``, DeepSpeed's CPU
    accelerator is selected first (``DS_ACCELERATOR=cpu``, unless already set). Raises ImportError ``missing`` (the
    way to install DeepSpeed) when it cannot be imported."""
    if on_cpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ImportError(missing) from err


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # cache: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
