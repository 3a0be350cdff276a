"""A stand-in for ``TrainingArguments`` holding only what the optimizer factory reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class OptimizerArgs:
    """The fields ``trainwell.optim.factory`` reads, with upstream's defaults."""

    optim: str = "adamw_torch"
    learning_rate: float = 5e-5
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    optim_args: str | None = None
