"""``trainwell.zero``, the former home of the ZeRO weights and memory helpers: the import path keeps working.

The code lives in :mod:`trainwell.backends.deepspeed.weights` and :mod:`trainwell.backends.deepspeed.memory_estimates`;
these are the same objects, re-exported.
(A package rather than a ``zero.py`` file, so that git sees the old file as moved, not rewritten.)
"""

from ..backends.deepspeed.memory_estimates import (BUFFER_FACTOR, MemoryEstimate, cmd_estimate_memory,
                                                   estimate_zero_memory, estimate_zero_memory_for_model,
                                                   format_memory_table)
from ..backends.deepspeed.weights import (cmd_zero_to_fp32, get_fp32_state_dict_from_zero_checkpoint,
                                          load_state_dict_from_zero_checkpoint, zero_to_fp32)

__all__ = [
    "MemoryEstimate", "cmd_estimate_memory", "cmd_zero_to_fp32", "estimate_zero_memory",
    "estimate_zero_memory_for_model", "format_memory_table", "get_fp32_state_dict_from_zero_checkpoint",
    "load_state_dict_from_zero_checkpoint", "zero_to_fp32",
]
