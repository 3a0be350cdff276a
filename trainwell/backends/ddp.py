"""DistributedDataParallel, optionally with ``ZeroRedundancyOptimizer`` (upstream 4.x's ``--sharded_ddp simple``).

Every rank holds the whole model; gradients are averaged by DDP's all-reduce during backward, so the step, the
clipping and the scaler of :class:`SingleDeviceBackend` apply unchanged. On gradient-accumulation micro-steps the
all-reduce is skipped with ``DDP.no_sync()``.

With ``sharded_ddp="simple"`` the optimizer the trainer built is rebuilt as a
``torch.distributed.optim.ZeroRedundancyOptimizer`` of the same class, parameter groups and hyper-parameters: each
rank keeps the optimizer state of its share of the parameters only. Its state is then "sharded", so the backend
saves it itself (``caps.sharded_state``): the state is consolidated on the saving rank(s) and written as
``optimizer.pt`` in the checkpoint folder; every rank reads it back on resume.
"""

from __future__ import annotations

import functools
import inspect
import logging
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ..checkpoint.layout import OPTIMIZER_NAME, CheckpointError, write_atomic
from ..runtime.precision import Precision
from ..utils.model_utils import activation_checkpointing
from .base import Capabilities
from .optimizer_state_forms import read_optimizer_file
from .single import _NULL, SingleDeviceBackend
from ..runtime.distributed import all_gather_object, get_rank
# torch.distributed.optim (ZeroRedundancyOptimizer) loads where sharded_ddp uses it: about a second of imports.

if TYPE_CHECKING:
    from torch.distributed.optim import ZeroRedundancyOptimizer

logger = logging.getLogger(__name__)


def wants_zero(args: Any) -> bool:
    """True when ``args.sharded_ddp`` holds ``simple`` (ZeroRedundancyOptimizer)."""
    options = getattr(args, "sharded_ddp", None) or []
    if isinstance(options, str):
        options = options.split()
    return any(getattr(option, "value", option) == "simple" for option in options)


def follow_optimizer(lr_scheduler: Any, optimizer: torch.optim.Optimizer) -> None:
    """Point ``lr_scheduler`` at ``optimizer`` (which replaced the one it was built with).

    The scheduler keeps its position and base learning rates; ``optimizer.step`` is marked the way torch's
    schedulers mark it, so the first ``scheduler.step()`` does not warn that the optimizer step was overridden.
    """
    if lr_scheduler is None or not hasattr(lr_scheduler, "optimizer"):
        return
    lr_scheduler.optimizer = optimizer
    step = optimizer.step
    if getattr(step, "_wrapped_by_lr_sched", False):
        return

    @functools.wraps(step)
    def tracked_step(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]  # torch's LRScheduler checks this private flag
        return step(*args, **kwargs)

    tracked_step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = tracked_step  # type: ignore[method-assign]


def build_zero_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """A ``ZeroRedundancyOptimizer`` of ``optimizer``'s class, parameter groups and hyper-parameters."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    cls = type(optimizer)
    accepted = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    # ``defaults`` may hold internal entries the constructor does not take (AdamW's decoupled_weight_decay).
    defaults = {k: v for k, v in optimizer.defaults.items() if takes_any or k in accepted}
    groups = [dict(group) for group in optimizer.param_groups]
    return ZeroRedundancyOptimizer(groups, optimizer_class=cls, **defaults)


class DDPBackend(SingleDeviceBackend):
    """One process per device, the model replicated and wrapped in ``DistributedDataParallel``.

    Reads ``ddp_find_unused_parameters`` (unset: True unless gradient checkpointing is on, as upstream, so a model
    whose forward leaves some parameters without gradient trains; set it to False to save DDP's graph walk on each
    backward), ``ddp_bucket_cap_mb``, ``ddp_broadcast_buffers`` and ``sharded_ddp`` from the arguments.
    """

    def __init__(self, args: Any, device: torch.device, precision: Precision) -> None:
        super().__init__(device, precision, n_gpu=1, place_model_on_device=True)
        self.args = args
        self.zero = wants_zero(args)
        # ZeRO's optimizer state lives on several ranks: saving it is a collective the backend runs itself (on the
        # training process group, so not from the background thread of async_save).
        self.caps = Capabilities(sharded_state=self.zero, async_checkpoint=not self.zero)

    # -- model -------------------------------------------------------------------------------------------------
    def ddp_kwargs(self, model: nn.Module | None = None) -> dict[str, Any]:
        """Keyword arguments of ``DistributedDataParallel`` from the training arguments (and ``model``)."""
        args = self.args
        find_unused = args.ddp_find_unused_parameters
        if find_unused is None:  # upstream's rule: find_unused_parameters breaks (reentrant) gradient checkpointing
            find_unused = not (activation_checkpointing(args)[0] or _model_checkpoints_activations(model))
        kwargs: dict[str, Any] = {"find_unused_parameters": bool(find_unused)}
        if self.device.type == "cuda":
            kwargs["device_ids"] = [self.device.index if self.device.index is not None else 0]
            kwargs["output_device"] = kwargs["device_ids"][0]
        if args.ddp_bucket_cap_mb is not None:
            kwargs["bucket_cap_mb"] = args.ddp_bucket_cap_mb
        if args.ddp_broadcast_buffers is not None:
            kwargs["broadcast_buffers"] = args.ddp_broadcast_buffers
        if getattr(args, "ddp_static_graph", None) is not None:  # upstream: ddp_kwargs["static_graph"]
            kwargs["static_graph"] = args.ddp_static_graph
        return kwargs

    def prepare_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Move ``model`` to this rank's device and wrap it in DDP for training (evaluation uses it unwrapped)."""
        model = model.to(self.device)
        self.model = model
        if not training:
            self.wrapped = model
            return model
        if isinstance(self.wrapped, nn.parallel.DistributedDataParallel) and self.wrapped.module is model:
            return self.wrapped  # a second train() call on the same model
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("DistributedDataParallel needs at least one parameter with requires_grad=True; "
                             "unfreeze some parameters of the model before training")
        self.wrapped = nn.parallel.DistributedDataParallel(model, **self.ddp_kwargs(model))
        return self.wrapped

    def setup_optimization(self, optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> None:
        """Adopt the trainer's optimizer, or rebuild it as a ZeroRedundancyOptimizer with ``sharded_ddp=simple``.

        The trainer must read ``backend.optimizer`` / ``backend.lr_scheduler`` back afterwards.
        """
        if self.zero:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            if not isinstance(optimizer, ZeroRedundancyOptimizer):
                optimizer = build_zero_optimizer(optimizer)
                follow_optimizer(lr_scheduler, optimizer)
        super().setup_optimization(optimizer, lr_scheduler)

    def no_sync(self, sync: bool) -> AbstractContextManager[Any]:
        """``DDP.no_sync()`` on accumulation micro-steps, so gradients are all-reduced once per optimizer step."""
        if sync or not isinstance(self.wrapped, nn.parallel.DistributedDataParallel):
            return _NULL
        return self.wrapped.no_sync()

    # -- state -------------------------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The model's weights (every rank holds them all); None before training prepared the model."""
        return None if self.model is None else self.model.state_dict()

    def save(self, folder: Path) -> None:
        """With ZeRO: consolidate the optimizer state on each saving rank and write ``optimizer.pt`` (collective)."""
        if not self.zero or self.optimizer is None or self.args.save_only_model:
            return

        optimizer = cast("ZeroRedundancyOptimizer", self.optimizer)  # self.zero: setup_optimization built one
        savers = [rank for rank, saves in enumerate(all_gather_object(bool(self.args.should_save))) if saves]
        for rank in savers:
            optimizer.consolidate_state_dict(to=rank)
            if rank == get_rank():
                state = optimizer.state_dict()
                write_atomic(Path(folder) / OPTIMIZER_NAME, lambda path: torch.save(state, path))  # noqa: B023 - called at once

    def load(self, folder: Path) -> None:
        """With ZeRO: every rank reads ``optimizer.pt`` and keeps its share of the state (without: as one process)."""
        if not self.zero:
            super().load(folder)
            return
        if self.optimizer is None:
            return
        path = Path(folder) / OPTIMIZER_NAME
        if not path.is_file():
            if self.args.save_only_model:
                logger.warning("%s has no %s (save_only_model=True); the optimizer starts fresh", folder,
                               OPTIMIZER_NAME)
                return
            raise CheckpointError(f"{path}: the ZeroRedundancyOptimizer state is missing from the checkpoint (the "
                                  "save was interrupted); resume from an earlier checkpoint")
        self.optimizer.load_state_dict(read_optimizer_file(path))


def _model_checkpoints_activations(model: nn.Module | None) -> bool:
    """A transformers model's own switch: ``is_activation_checkpointing`` (5.x), else the older
    ``is_gradient_checkpointing`` (read only then: 5.x deprecates it with a FutureWarning on every read)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(getattr(model, "is_activation_checkpointing", False))
    return bool(getattr(model, "is_gradient_checkpointing", False))
