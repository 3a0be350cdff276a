"""Upstream Trainer names that user code calls and that trainwell answers from its own parts.

``accelerator`` (see :mod:`trainwell.trainer.accelerator`), ``deepspeed`` (the engine, once training has built it),
``is_deepspeed_enabled`` / ``is_fsdp_enabled``, ``get_num_trainable_parameters`` / ``get_learning_rates`` /
``get_optimizer_group``, and the application of ``train(trial=<dict>)`` hyper-parameters to the arguments. (The
seeds' legacy ``prediction_loop`` lives with the evaluation loop it routes to, in :mod:`trainwell.loops.eval_loop`.)
"""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

logger = logging.getLogger("trainwell.trainer.trainer")


class TrainerCompat:
    """Mixed into :class:`trainwell.Trainer`; relies on ``args``, ``model``, ``optimizer``, ``backend`` and
    ``_init_checkpointing``."""

    @property
    def accelerator(self) -> Any:
        """An object answering the ``accelerate.Accelerator`` calls user code makes (``gather``,
        ``is_main_process``, ``unwrap_model``, ``wait_for_everyone``, ``backward``, ``device``...)."""
        acc = self.__dict__.get("_accelerator")
        if acc is None:
            from .accelerator import TrainerAccelerator

            acc = self.__dict__["_accelerator"] = TrainerAccelerator(self)
        return acc

    @property
    def deepspeed(self) -> Any:
        """The DeepSpeed engine (``trainer.deepspeed.save_checkpoint(dir)``); None before training or without
        ``deepspeed=``."""
        return self.backend.engine

    @property
    def is_deepspeed_enabled(self) -> bool:
        """True when ``args.deepspeed`` is set."""
        return self.args.deepspeed is not None

    @property
    def is_fsdp_enabled(self) -> bool:
        """True when ``args.fsdp`` is set."""
        return bool(self.args.fsdp)

    def get_num_trainable_parameters(self) -> int:
        """Number of parameters with ``requires_grad``."""
        return sum(p.numel() for p in self.model.parameters() if p.requires_grad)

    def get_learning_rates(self) -> list[float]:
        """The learning rate of each parameter group of the optimizer."""
        if self.optimizer is None:
            raise ValueError("get_learning_rates: the optimizer is not built yet; call it after trainer.train() "
                             "has started (or after trainer.create_optimizer())")
        return [group["lr"] for group in self.optimizer.param_groups]

    def get_optimizer_group(self, param: nn.Parameter | str | None = None) -> Any:
        """The optimizer's parameter groups, or the group holding ``param``."""
        if self.optimizer is None:
            raise ValueError("get_optimizer_group: the optimizer is not built yet; call trainer.create_optimizer()")
        if param is None:
            return self.optimizer.param_groups
        for group in self.optimizer.param_groups:
            if any(p is param for p in group["params"]):
                return group
        return self.optimizer.param_groups

    def _apply_trial_params(self, trial: Any) -> None:
        """``train(trial=<dict>)``: set each hyper-parameter on the arguments, as upstream does for Ray/W&B trials.

        The arguments are replaced by a validated copy (``__post_init__`` runs again); an unknown name or one the
        Trainer reads only when it is built (``fp16``, ``deepspeed``...) is refused with an error naming it.
        """
        if not isinstance(trial, dict) or not trial:
            return
        from ..hpsearch import trial_arguments
        from ..utils.losses import LabelSmoother

        params = {k: v for k, v in trial.items() if k != "wandb"}  # upstream drops W&B's entry of a Ray config
        self.args = trial_arguments(self.args, params, self.args.output_dir, source="train(trial=...) got")
        self._init_checkpointing()
        factor = self.args.label_smoothing_factor
        self.label_smoother = LabelSmoother(factor) if factor else None
        logger.info("Trial hyper-parameters: %s", params)
