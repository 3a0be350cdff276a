"""Process topology from the launcher's environment, device choice, and small collectives.

Every launcher the seeds use leaves its own variables behind: torchrun / ``torch.distributed.run`` and the
``deepspeed`` launcher set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the old ``torch.distributed.launch`` passes
``--local_rank`` (read into ``TrainingArguments.local_rank``); ``accelerate launch`` sets the same variables;
SLURM's ``srun`` sets ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``. Nothing here has side effects at
import time; the process group is created by :func:`init_process_group` when training starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits: global rank, number of processes, rank on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = -1
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        """True when a launcher started (or emulates) a process group, even of one process."""
        return self.local_rank != -1


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            return int(value)
    return None


def read_launch_env(local_rank_arg: int = -1) -> LaunchEnv:
    """Read rank and world size from the environment (torchrun, deepspeed, accelerate, SLURM, notebook emulation).

    ``local_rank_arg`` is the ``--local_rank`` passed by the legacy ``torch.distributed.launch``; the
    environment wins when both are present.
    """
    local_rank = _int_env("LOCAL_RANK")
    rank = _int_env("RANK")
    world = _int_env("WORLD_SIZE")
    if rank is None and world is None and _int_env("SLURM_NTASKS") is not None and "SLURM_PROCID" in os.environ:
        # srun without torchrun: one task per process.
        rank, world, local_rank = _int_env("SLURM_PROCID"), _int_env("SLURM_NTASKS"), _int_env("SLURM_LOCALID")
    if local_rank is None:
        local_rank = local_rank_arg
    if local_rank == -1 and world is None:
        return LaunchEnv()
    if local_rank == -1:
        local_rank = rank or 0
    world = world or 1
    local_world = _int_env("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE") or world
    return LaunchEnv(rank=rank if rank is not None else local_rank, world_size=world,
                     local_rank=local_rank, local_world_size=local_world)


def resolve_device(*, use_cpu: bool, local_rank: int) -> "torch.device":
    """The device this process trains on: its CUDA device under a launcher, else cuda:0, else MPS, else CPU."""
    import torch

    if use_cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", max(local_rank, 0))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def default_backend(device: "torch.device") -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(env: LaunchEnv, device: "torch.device", *, backend: str | None = None,
                       timeout_s: int = 1800) -> bool:
    """Create the default process group when a launcher started this process; True when one exists.

    Idempotent: an existing group (made by the user, DeepSpeed or an earlier Trainer) is kept.
    """
    import torch.distributed as dist

    if not env.distributed or not dist.is_available():
        return False
    if dist.is_initialized():
        return True
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if device.type == "cuda":
        import torch

        torch.cuda.set_device(device)
    dist.init_process_group(backend=backend or default_backend(device), rank=env.rank,
                            world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    return True


def is_dist() -> bool:
    """True inside an initialised process group."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank (0 outside a process group)."""
    import torch.distributed as dist

    return dist.get_rank() if is_dist() else 0


def get_world_size() -> int:
    """Number of processes (1 outside a process group)."""
    import torch.distributed as dist

    return dist.get_world_size() if is_dist() else 1


def barrier() -> None:
    """Wait for every rank; a no-op in a single process."""
    import torch.distributed as dist

    if is_dist():
        dist.barrier()
