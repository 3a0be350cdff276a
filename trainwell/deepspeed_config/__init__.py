"""``trainwell.deepspeed_config``, the former home of the DeepSpeed config helpers: the import path keeps working.

The code lives in :mod:`trainwell.backends.deepspeed.config`; these are the same objects, re-exported.
(A package rather than a ``deepspeed_config.py`` file, so that git sees the old file as moved, not rewritten.)
"""

from ..backends.deepspeed.config import (AUTO, DS_TO_TRAINER_SCHEDULER, HIDDEN_SIZE_KEYS, DeepSpeedConfig,
                                         HfDeepSpeedConfig, get_deepspeed_config, get_value, infer_hidden_size,
                                         is_deepspeed_zero3_enabled, load_deepspeed_config, remaining_auto_keys,
                                         resolve_deepspeed_config, set_deepspeed_config, unset_deepspeed_config)

__all__ = [
    "DeepSpeedConfig", "HfDeepSpeedConfig", "DS_TO_TRAINER_SCHEDULER", "get_deepspeed_config", "infer_hidden_size",
    "is_deepspeed_zero3_enabled", "load_deepspeed_config", "remaining_auto_keys", "resolve_deepspeed_config",
    "set_deepspeed_config", "unset_deepspeed_config",
]
