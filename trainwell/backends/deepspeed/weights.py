"""Getting the weights out of DeepSpeed ZeRO checkpoints, and estimating ZeRO memory needs.

- :func:`get_fp32_state_dict_from_zero_checkpoint` / :func:`load_state_dict_from_zero_checkpoint`: the DeepSpeed
  helpers of the guide's "getting the weights out" recipes (re-exported, imported lazily);
- :func:`zero_to_fp32`: a ``checkpoint-<step>`` folder (or its parent with ``latest``) -> one fp32 weights file;
- :func:`estimate_zero_memory`: the per-CPU / per-GPU memory table for ZeRO-2 and ZeRO-3 ("Memory Requirements"),
  from DeepSpeed's estimators when installed, else the same formulas written here;
- :func:`cmd_zero_to_fp32`, :func:`cmd_estimate_memory`: the ``trainwell zero-to-fp32`` / ``estimate-memory`` commands.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn

_GIB = 2 ** 30
BUFFER_FACTOR = 1.5  # DeepSpeed's additional_buffer_factor for CPU memory


def _zero_to_fp32_module() -> Any:
    if not _cuda_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        from deepspeed.utils import zero_to_fp32
    except ImportError as err:
        raise ImportError("Reading ZeRO checkpoints needs DeepSpeed: pip install trainwell[deepspeed], or run the "
                          "zero_to_fp32.py script DeepSpeed wrote into the checkpoint folder") from err
    return zero_to_fp32


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None, *,
                                             trust_pickles: bool = False) -> dict[str, "torch.Tensor"]:
    """The consolidated fp32 ``state_dict`` of a ZeRO-2/3 checkpoint (on the CPU, any number of saving ranks).

    DeepSpeed unpickles its ``*.pt`` files with ``weights_only=False``; unless ``trust_pickles``, each is first
    scanned against the allow-list of :mod:`trainwell.checkpoint.safe_pickle` (an ``UnsafeCheckpointError`` names
    the file holding anything else).
    """
    _check_zero_checkpoint(checkpoint_dir, tag)
    if not trust_pickles:
        _check_pickles(Path(checkpoint_dir), tag)
    return dict(_zero_to_fp32_module().get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag))


def load_state_dict_from_zero_checkpoint(model: "nn.Module", checkpoint_dir: str | os.PathLike,
                                         tag: str | None = None, *, trust_pickles: bool = False) -> "nn.Module":
    """Move ``model`` to the CPU and load the consolidated fp32 weights of the checkpoint into it.

    Afterwards the model is a plain PyTorch module: a DeepSpeed engine built on it must be re-created.
    """
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, trust_pickles=trust_pickles)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def _check_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None) -> None:
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such checkpoint folder; pass a checkpoint-<step> folder written with "
                                "a DeepSpeed config")
    if tag is None and not (folder / "latest").is_file():
        raise FileNotFoundError(f"{folder} has no 'latest' file, so it is not a DeepSpeed checkpoint (saved without "
                                "deepspeed=..., or with save_only_model=True); pass tag='global_stepN' if the "
                                "global_step folder exists")


def _check_pickles(folder: Path, tag: str | None) -> None:
    """Scan every ``*.pt`` file DeepSpeed would unpickle (the tag's folder) against the allow-list."""
    from ...checkpoint.safe_pickle import check_pickle_file

    if tag is None:
        tag = (folder / "latest").read_text(encoding="utf-8").strip()
    step_dir = folder / tag
    if not step_dir.is_dir():
        raise FileNotFoundError(f"{step_dir}: no such folder ('latest' or tag names {tag!r})")
    for path in sorted(step_dir.rglob("*.pt")):
        check_pickle_file(path)


def zero_to_fp32(checkpoint_dir: str | os.PathLike, output_file: str | os.PathLike, tag: str | None = None, *,
                 trust_pickles: bool = False) -> Path:
    """Write the checkpoint's consolidated fp32 weights to ``output_file`` (``.safetensors``, else ``torch.save``)."""
    import torch

    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, trust_pickles=trust_pickles)
    out = Path(output_file)
    if out.is_dir():
        out = out / "model.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in state.items()}
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(_untie(state), str(out), metadata={"format": "pt"})
    else:
        torch.save(state, out)
    return out


def _untie(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """safetensors refuses tensors sharing memory: clone the repeats."""
    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        ptr = tensor.data_ptr()
        out[key] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    return out


# -- memory estimates ----------------------------------------------------------------------------------------------
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


# -- command line --------------------------------------------------------------------------------------------------
def cmd_zero_to_fp32(argv: Sequence[str] | None = None) -> int:
    """``trainwell zero-to-fp32 CHECKPOINT_DIR OUTPUT_FILE [--tag global_stepN]``."""
    from ...cmdline import ArgParser

    parser = ArgParser(prog="trainwell zero-to-fp32",
                                     description="Consolidate a DeepSpeed ZeRO checkpoint into one fp32 weights file.")
    parser.add_argument("checkpoint_dir", help="a checkpoint-<step> folder (with 'latest' and global_step*/)")
    parser.add_argument("output_file", help="where to write the weights (.safetensors, or a torch.save file)")
    parser.add_argument("--tag", default=None, help="the global_step folder to read (default: the one in 'latest')")
    parser.add_argument("--trust-checkpoint-pickles", action="store_true",
                        help="skip the allow-list check of DeepSpeed's pickled files (their code may run: only for "
                             "checkpoints from a source you trust)")
    ns = parser.parse_args(argv)
    out = zero_to_fp32(ns.checkpoint_dir, ns.output_file, tag=ns.tag, trust_pickles=ns.trust_checkpoint_pickles)
    print(f"wrote fp32 weights to {out}")
    return 0


def cmd_estimate_memory(argv: Sequence[str] | None = None) -> int:
    """``trainwell estimate-memory --params N [--gpus G --nodes K --largest-layer-params L]``."""
    from ...cmdline import ArgParser, positive_float, positive_int

    parser = ArgParser(prog="trainwell estimate-memory",
                                     description="ZeRO-2/3 memory needs for parameters, gradients, optimizer states.")
    parser.add_argument("--params", type=positive_float, required=True, help="number of parameters, e.g. 3e9")
    parser.add_argument("--gpus", type=positive_int, default=1, help="GPUs per node")
    parser.add_argument("--nodes", type=positive_int, default=1, help="number of nodes")
    parser.add_argument("--largest-layer-params", type=positive_float, default=None,
                        help="parameters of the biggest single layer (default: params/40)")
    ns = parser.parse_args(argv)
    params = int(ns.params)
    largest = int(ns.largest_layer_params) if ns.largest_layer_params is not None else None
    rows = estimate_zero_memory(params, ns.gpus, ns.nodes, largest_layer_params=largest)
    print(format_memory_table(rows, params, ns.gpus, ns.nodes))
    return 0


__all__ = [
    "MemoryEstimate", "cmd_estimate_memory", "cmd_zero_to_fp32", "estimate_zero_memory",
    "estimate_zero_memory_for_model", "format_memory_table", "get_fp32_state_dict_from_zero_checkpoint",
    "load_state_dict_from_zero_checkpoint", "zero_to_fp32",
]
