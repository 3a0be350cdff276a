"""``trainwell env``: the versions and devices to paste into a bug report.

Prints a Markdown-friendly block: platform, Python, trainwell, torch (with its CUDA, cuDNN, NCCL and the devices
it sees), and the optional packages trainwell works with (deepspeed, transformers, accelerate, ...), each "not
installed" when absent. Nothing is imported beyond torch; versions come from the installed distributions.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from ..arguments import RaisingArgumentParser

OPTIONAL_PACKAGES = ("deepspeed", "transformers", "accelerate", "datasets", "safetensors", "numpy", "tqdm",
                     "tensorboard", "mlflow", "wandb", "optuna", "matplotlib")
_ENV_VARS = ("CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "LOCAL_RANK", "OMP_NUM_THREADS", "DS_ACCELERATOR")


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_rows() -> list[tuple[str, str]]:
    """``(name, value)`` rows describing this machine and its packages."""
    from ... import __version__

    rows = [("trainwell", __version__), ("platform", platform.platform()),
            ("python", f"{platform.python_version()} ({platform.python_implementation()}, {sys.executable})"),
            ("cpus", str(os.cpu_count()))]
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        rows.append(("torch", "not installed"))
    else:
        rows.append(("torch", torch.__version__))
        rows.append(("torch threads", str(torch.get_num_threads())))
        cuda = torch.version.cuda or "none (CPU build)"
        rows.append(("CUDA (torch built with)", cuda))
        available = torch.cuda.is_available()
        rows.append(("CUDA available", str(available)))
        if available:
            rows.append(("cuDNN", str(torch.backends.cudnn.version())))
            try:
                rows.append(("NCCL", ".".join(map(str, torch.cuda.nccl.version()))))
            except Exception:
                rows.append(("NCCL", "unavailable"))
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                rows.append((f"GPU {i}", f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
                             f"compute capability {props.major}.{props.minor}"))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            rows.append(("MPS available", "True"))
        rows.append(("distributed backends", ", ".join(
            name for name, ok in (("gloo", torch.distributed.is_gloo_available()),
                                  ("nccl", torch.distributed.is_nccl_available()),
                                  ("mpi", torch.distributed.is_mpi_available())) if ok) or "none"))
    rows += [(name, _version(name)) for name in OPTIONAL_PACKAGES]
    rows += [(var, os.environ[var]) for var in _ENV_VARS if var in os.environ]
    return rows


def format_environment(rows: list[tuple[str, str]]) -> str:
    """The rows as a block to paste into an issue."""
    width = max(len(name) for name, _ in rows)
    body = "\n".join(f"- {(name + ':').ljust(width + 1)} {value}" for name, value in rows)
    return f"Copy and paste this into your bug report:\n\n{body}\n"


def run(argv: list[str]) -> int:
    """``trainwell env``."""
    parser = RaisingArgumentParser(prog="trainwell env",
                                   description="Print the versions and devices, for a bug report.")
    parser.parse_args(argv)
    print(format_environment(environment_rows()))
    return 0
