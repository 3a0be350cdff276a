"""ZeRO memory estimates: what parameters, gradients and optimizer states need per CPU and per GPU.

- :func:`estimate_zero_memory`: the per-CPU / per-GPU memory table for ZeRO-2 and ZeRO-3 ("Memory Requirements" of
  the DeepSpeed guide), from DeepSpeed's estimators when installed, else the same formulas written here;
- :func:`estimate_zero_memory_for_model`: the same with the parameter counts read from a model;
- the ``trainwell estimate-memory`` command, which calls this module, lives in the command line:
  :func:`trainwell.cli.commands.deepspeed_tools.cmd_estimate_memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

_GIB = 2 ** 30
BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for CPU memory


@dataclass(frozen=True)
class MemoryEstimate:
    """Memory for parameters, gradients and optimizer states of one ZeRO setup (no activations or buffers)."""

    stage: int
    offload_param: str
    offload_optimizer: str
    zero_init: bool | None
    cpu_bytes: int
    gpu_bytes: int


def _zero3_formula(total: int, largest: int, gpus: int, nodes: int, offload_opt: bool, offload_param: bool,
                   zero_init: bool) -> tuple[int, int]:
    """Bytes per CPU and per GPU under ZeRO-3 (18 bytes/param of fp16 weights+grads, fp32 master and Adam states)."""
    total_gpus, gpus_factor = nodes * gpus, 1 / nodes
    largest_mem = 4 * largest
    if offload_opt and offload_param:
        gpu = largest_mem
        cpu = total * (18 * gpus_factor if zero_init else max(4 * gpus, 18 * gpus_factor)) * BUFFER_FACTOR
    elif offload_opt:
        gpu = largest_mem + int(2 * total / total_gpus)
        cpu = total * (16 * gpus_factor if zero_init else max(4 * gpus, 16 * gpus_factor)) * BUFFER_FACTOR
    else:
        gpu = largest_mem + int(18 * total / total_gpus)
        cpu = (largest * 4 * gpus if zero_init else total * 4 * gpus) * BUFFER_FACTOR
    return int(cpu), int(gpu)


def _zero2_formula(total: int, gpus: int, nodes: int, offload_opt: bool) -> tuple[int, int]:
    """Bytes per CPU and per GPU under ZeRO-2."""
    total_gpus = nodes * gpus
    if offload_opt:
        return int(total * max(4 * total_gpus, 16) * BUFFER_FACTOR), 2 * total
    return int(total * 4 * gpus * BUFFER_FACTOR), 2 * total + int(18 * total / total_gpus)


def _estimators() -> tuple[Any, Any] | None:
    """DeepSpeed's own estimator functions, or None when DeepSpeed is not installed."""
    try:
        from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs as z3
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as z2
    except Exception:  # not installed, or an incompatible version: use our formulas
        return None
    return z2, z3


def estimate_zero_memory(params: int, gpus: int = 1, nodes: int = 1, *, largest_layer_params: int | None = None,
                         use_deepspeed: bool = True) -> list[MemoryEstimate]:
    """The ZeRO-3 (6 rows) and ZeRO-2 (2 rows) memory table for a model of ``params`` parameters.

    ``largest_layer_params`` (the biggest single module's own parameters) matters for ZeRO-3; when unknown it is
    taken as params/40, about what a transformer's embedding weighs.
    """
    if params <= 0 or gpus <= 0 or nodes <= 0:
        raise ValueError(f"params={params}, gpus={gpus}, nodes={nodes}: all must be positive integers")
    largest = largest_layer_params if largest_layer_params is not None else max(params // 40, 1)
    ds = _estimators() if use_deepspeed else None
    rows = []
    for offload_param, offload_opt in ((True, True), (False, True), (False, False)):
        for zero_init in (True, False):
            if ds is not None:
                cpu, gpu, _ = ds[1](params, largest, num_gpus_per_node=gpus, num_nodes=nodes,
                                    cpu_offload=offload_opt, cpu_offload_params=offload_param, zero_init=zero_init)
            else:
                cpu, gpu = _zero3_formula(params, largest, gpus, nodes, offload_opt, offload_param, zero_init)
            rows.append(MemoryEstimate(3, _dev(offload_param), _dev(offload_opt), zero_init, int(cpu), int(gpu)))
    for offload_opt in (True, False):
        if ds is not None:
            cpu, gpu = ds[0](params, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=offload_opt)
        else:
            cpu, gpu = _zero2_formula(params, gpus, nodes, offload_opt)
        rows.append(MemoryEstimate(2, "none", _dev(offload_opt), None, int(cpu), int(gpu)))
    return rows


def _dev(offloaded: bool) -> str:
    return "cpu" if offloaded else "none"


def estimate_zero_memory_for_model(model: "nn.Module", gpus: int = 1, nodes: int = 1) -> list[MemoryEstimate]:
    """:func:`estimate_zero_memory` with the parameter counts read from ``model`` (shared weights counted once)."""
    total = sum({p.data_ptr(): p.numel() for p in model.parameters()}.values())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    return estimate_zero_memory(total, gpus, nodes, largest_layer_params=largest)


def format_memory_table(rows: Sequence[MemoryEstimate], params: int, gpus: int, nodes: int) -> str:
    """The estimates as the guide prints them: per CPU | per GPU | options."""
    lines = [f"Memory for parameters, gradients and optimizer states: {nodes} node(s), {gpus} GPU(s) per node, "
             f"{params / 1e6:.0f}M parameters (activations and temporary buffers not included)."]
    for stage in (3, 2):
        lines.append(f"ZeRO-{stage}:\n  per CPU  |  per GPU |   Options")
        for r in (r for r in rows if r.stage == stage):
            options = f"offload_param={r.offload_param:<4}, offload_optimizer={r.offload_optimizer:<4}"
            if r.zero_init is not None:
                options += f", zero_init={int(r.zero_init)}"
            lines.append(f"  {r.cpu_bytes / _GIB:7.2f}GB | {r.gpu_bytes / _GIB:7.2f}GB | {options}")
    return "\n".join(lines)


__all__ = [
    "BUFFER_FACTOR", "MemoryEstimate", "estimate_zero_memory", "estimate_zero_memory_for_model",
    "format_memory_table",
]
