"""``build_backend(args)``: the only place that names the concrete backends.

* no launcher, or a launcher with one process (``WORLD_SIZE=1``, a notebook emulating a launcher): one device
  (:class:`SingleDeviceBackend`, ``nn.DataParallel`` over several visible GPUs);
* several processes: the process group is created (``nccl`` on CUDA, ``gloo`` otherwise, or ``ddp_backend``;
  ``ddp_timeout``), then ``fsdp`` selects :class:`FSDPBackend` (``no_shard`` means plain DDP), otherwise
  :class:`DDPBackend` (with ``ZeroRedundancyOptimizer`` for ``sharded_ddp="simple"``; ``zero_dp_2``/``zero_dp_3``
  were already turned into ``fsdp`` options by ``TrainingArguments``).
"""

from __future__ import annotations

import logging
from typing import Any

from ..runtime.distributed import init_process_group, read_launch_env
from ..runtime.precision import Precision
from .base import Backend
from .ddp import DDPBackend, wants_zero
from .deepspeed.backend import DeepSpeedBackend
from .fsdp import FSDPBackend, fsdp_options
from .single import SingleDeviceBackend

logger = logging.getLogger(__name__)


def _fsdp_shards(args: Any) -> bool:
    """True when ``args.fsdp`` asks for sharding (``no_shard`` alone is DDP)."""
    options = fsdp_options(args)
    if "no_shard" in options:
        logger.info("fsdp='no_shard' replicates the whole model on every rank: trainwell runs it as DDP")
        return False
    return bool(options)


def build_backend(args: Any) -> Backend:
    """Choose and create the backend the arguments ask for (creating the process group under a launcher)."""
    if getattr(args, "deepspeed", None):
        return DeepSpeedBackend(args, args.device)  # makes its own process group (DeepSpeed needs one)
    env = read_launch_env(getattr(args, "local_rank", -1))
    device = args.device
    precision = Precision.from_args(args, device)
    if env.distributed and env.world_size > 1:
        init_process_group(env, device, backend=getattr(args, "ddp_backend", None),
                           timeout_s=int(getattr(args, "ddp_timeout", 1800)))
        if _fsdp_shards(args):
            return FSDPBackend(args, device, precision)
        return DDPBackend(args, device, precision)
    if getattr(args, "fsdp", None) or _zero(args):
        logger.warning("fsdp / sharded_ddp need several processes (launch with torchrun --nproc_per_node=N); "
                       "training on one device without sharding")
    return SingleDeviceBackend(device, precision, n_gpu=args.n_gpu,
                               place_model_on_device=args.place_model_on_device is not False)


def _zero(args: Any) -> bool:
    return wants_zero(args)
