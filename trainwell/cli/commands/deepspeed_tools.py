"""The two DeepSpeed commands: ``trainwell zero-to-fp32`` (consolidate a ZeRO checkpoint's weights) and ``trainwell
estimate-memory`` (ZeRO-2/3 memory needs); their work is in ``backends/deepspeed/`` (weights.py,
memory_estimates.py); the command line loads this module only when one of them runs."""

from __future__ import annotations

from collections.abc import Sequence

from ...backends.deepspeed.memory_estimates import estimate_zero_memory, format_memory_table
from ...backends.deepspeed.weights import zero_to_fp32
from ..arguments import RaisingArgumentParser, positive_float, positive_int

__all__ = ["cmd_estimate_memory", "cmd_zero_to_fp32"]


def cmd_zero_to_fp32(argv: Sequence[str] | None = None) -> int:
    """``trainwell zero-to-fp32 CHECKPOINT_DIR OUTPUT_FILE [--tag global_stepN]``."""
    parser = RaisingArgumentParser(prog="trainwell zero-to-fp32",
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
    parser = RaisingArgumentParser(prog="trainwell estimate-memory",
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
