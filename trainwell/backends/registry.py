"""``build_backend(args)``: the only place that names the concrete backends."""

from __future__ import annotations

from typing import Any

from ..distributed import init_process_group, read_launch_env
from ..precision import Precision
from .base import Backend


def build_backend(args: Any) -> Backend:
    """Choose and create the backend the arguments ask for (creating the process group if a launcher started us)."""
    if getattr(args, "deepspeed", None):
        raise NotImplementedError(
            "deepspeed=... is not supported yet by trainwell; remove the deepspeed argument (or use fsdp) for now"
        )
    env = read_launch_env(getattr(args, "local_rank", -1))
    device = args.device
    precision = Precision.from_args(args, device)
    if env.distributed and env.world_size > 1:
        init_process_group(env, device, backend=getattr(args, "ddp_backend", None),
                           timeout_s=int(getattr(args, "ddp_timeout", 1800)))
        if getattr(args, "fsdp", None):
            from .fsdp import FSDPBackend

            return FSDPBackend(args, device, precision)
        from .ddp import DDPBackend

        return DDPBackend(args, device, precision)
    from .single import SingleDeviceBackend

    return SingleDeviceBackend(device, precision, n_gpu=args.n_gpu,
                               place_model_on_device=args.place_model_on_device)
