"""Upstream Trainer names that user code calls and that trainwell answers from its own parts.

The :class:`trainwell.Trainer` methods ``get_num_trainable_parameters``, ``get_learning_rates``,
``get_optimizer_group`` and the application of ``train(trial=<dict>)`` hyper-parameters delegate to the functions
here, each given exactly what it reads; ``accelerator`` is :mod:`trainwell.trainer.accelerator`. (Upstream's legacy
``prediction_loop`` is a Trainer method beside ``evaluation_loop``, which it routes to.)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from ..backends.deepspeed.config import get_deepspeed_config
from ..hpsearch import trial_arguments

logger = logging.getLogger("trainwell.trainer.trainer")


def num_trainable_parameters(model: nn.Module) -> int:
    """Number of parameters with ``requires_grad``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def learning_rates(optimizer: torch.optim.Optimizer | None) -> list[float]:
    """The learning rate of each parameter group of ``optimizer``; a clear error before it is built."""
    if optimizer is None:
        raise ValueError("get_learning_rates: the optimizer is not built yet; call it after trainer.train() "
                         "has started (or after trainer.create_optimizer())")
    return [group["lr"] for group in optimizer.param_groups]


def optimizer_group(optimizer: torch.optim.Optimizer | None, param: nn.Parameter | str | None = None) -> Any:
    """As upstream's ``Trainer.get_optimizer_group``: the parameter group (a dict) holding ``param``, else the
    parameter list of every group (``[group["params"], ...]``, one entry per group, empty ones too)."""
    if optimizer is None:
        raise ValueError("get_optimizer_group: the optimizer is not built yet; call trainer.create_optimizer()")
    if param is not None:
        for group in optimizer.param_groups:
            if any(p is param for p in group["params"]):  # identity: `in` would compare tensors elementwise
                return group
    return [group["params"] for group in optimizer.param_groups]


def trial_arguments_from(args: Any, trial: Any) -> Any:
    """``train(trial=<dict>)``: ``args`` with each hyper-parameter set, as upstream does for Ray/W&B trials; None when
    ``trial`` is not a non-empty dict.

    The arguments are replaced by a validated copy (``__post_init__`` runs again); an unknown name or one the
    Trainer reads only when it is built (``fp16``, ``deepspeed``...) is refused with an error naming it.
    """
    if not isinstance(trial, dict) or not trial:
        return None

    params = {k: v for k, v in trial.items() if k != "wandb"}  # upstream drops W&B's entry of a Ray config
    logger.info("Trial hyper-parameters: %s", params)
    return trial_arguments(args, params, args.output_dir, source="train(trial=...) got")


def tensor_parallel_size(model: nn.Module, *, deepspeed: bool) -> int:
    """The model's ``_tp_size`` (loaded with a tensor-parallel plan), else DeepSpeed's ``tensor_parallel.autotp_size``
    when DeepSpeed is on, else 1."""
    model_tp = getattr(model, "_tp_size", None)
    if model_tp is not None:
        return int(model_tp)
    if deepspeed:
        live = get_deepspeed_config()
        if live is not None:
            return int(live.get_value("tensor_parallel.autotp_size", 1))
    return 1
