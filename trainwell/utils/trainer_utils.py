"""Small shared types of the public API: strategy enums, result tuples, seeding and checkpoint names.

Kept free of heavy imports (numpy/torch are imported inside the functions that need them) so that
``import trainwell`` stays fast.
"""

from __future__ import annotations

import os
import random
import re
from enum import Enum
from typing import Any, NamedTuple

PREFIX_CHECKPOINT_DIR = "checkpoint"
_re_checkpoint = re.compile(r"^" + PREFIX_CHECKPOINT_DIR + r"\-(\d+)$")


class ExplicitEnum(str, Enum):
    """A string enum whose lookup error lists the valid values."""

    @classmethod
    def _missing_(cls, value: object) -> Any:
        raise ValueError(
            f"{value!r} is not a valid {cls.__name__}, please select one of {[m.value for m in cls]}"
        )

    def __str__(self) -> str:  # "steps", not "IntervalStrategy.STEPS", in logs and json
        return str(self.value)


class IntervalStrategy(ExplicitEnum):
    """When to log / evaluate: never, every ``*_steps`` optimizer steps, or at each epoch end."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"


class SaveStrategy(ExplicitEnum):
    """When to save a checkpoint; ``best`` saves whenever a new best metric is reached."""

    NO = "no"
    STEPS = "steps"
    EPOCH = "epoch"
    BEST = "best"


EvaluationStrategy = IntervalStrategy  # deprecated upstream alias


class HubStrategy(ExplicitEnum):
    """What to push to the hub and when (see :mod:`trainwell.trainer.hub`)."""

    END = "end"
    EVERY_SAVE = "every_save"
    CHECKPOINT = "checkpoint"
    ALL_CHECKPOINTS = "all_checkpoints"


class SchedulerType(ExplicitEnum):
    """Names of the learning-rate schedules of ``lr_scheduler_type``."""

    LINEAR = "linear"
    COSINE = "cosine"
    COSINE_WITH_RESTARTS = "cosine_with_restarts"
    POLYNOMIAL = "polynomial"
    CONSTANT = "constant"
    CONSTANT_WITH_WARMUP = "constant_with_warmup"
    INVERSE_SQRT = "inverse_sqrt"
    REDUCE_ON_PLATEAU = "reduce_lr_on_plateau"
    COSINE_WITH_MIN_LR = "cosine_with_min_lr"
    COSINE_WARMUP_WITH_MIN_LR = "cosine_warmup_with_min_lr"
    WARMUP_STABLE_DECAY = "warmup_stable_decay"


class OptimizerNames(ExplicitEnum):
    """Names of the optimizers of ``optim``."""

    ADAMW_TORCH = "adamw_torch"
    ADAMW_TORCH_FUSED = "adamw_torch_fused"
    ADAMW_HF = "adamw_hf"
    ADAFACTOR = "adafactor"
    SGD = "sgd"
    ADAGRAD = "adagrad"
    RMSPROP = "rmsprop"
    ADAMW_APEX_FUSED = "adamw_apex_fused"
    ADAMW_BNB = "adamw_bnb_8bit"
    ADAMW_TORCH_XLA = "adamw_torch_xla"
    ADAMW_TORCH_NPU_FUSED = "adamw_torch_npu_fused"
    ADAMW_ANYPRECISION = "adamw_anyprecision"
    ADAMW_TORCH_4BIT = "adamw_torch_4bit"
    ADAMW_TORCH_8BIT = "adamw_torch_8bit"
    ADEMAMIX = "ademamix"
    ADAMW_8BIT = "adamw_8bit"
    ADEMAMIX_8BIT = "ademamix_8bit"
    LION_8BIT = "lion_8bit"
    LION = "lion_32bit"
    PAGED_ADAMW = "paged_adamw_32bit"
    PAGED_ADAMW_8BIT = "paged_adamw_8bit"
    PAGED_ADEMAMIX = "paged_ademamix_32bit"
    PAGED_ADEMAMIX_8BIT = "paged_ademamix_8bit"
    PAGED_LION = "paged_lion_32bit"
    PAGED_LION_8BIT = "paged_lion_8bit"
    RMSPROP_BNB = "rmsprop_bnb"
    RMSPROP_8BIT = "rmsprop_bnb_8bit"
    RMSPROP_32BIT = "rmsprop_bnb_32bit"
    GALORE_ADAMW = "galore_adamw"
    GALORE_ADAMW_8BIT = "galore_adamw_8bit"
    GALORE_ADAFACTOR = "galore_adafactor"
    GALORE_ADAMW_LAYERWISE = "galore_adamw_layerwise"
    GALORE_ADAMW_8BIT_LAYERWISE = "galore_adamw_8bit_layerwise"
    GALORE_ADAFACTOR_LAYERWISE = "galore_adafactor_layerwise"
    LOMO = "lomo"
    ADALOMO = "adalomo"
    GROKADAMW = "grokadamw"
    SCHEDULE_FREE_RADAM = "schedule_free_radam"
    SCHEDULE_FREE_ADAMW = "schedule_free_adamw"
    SCHEDULE_FREE_SGD = "schedule_free_sgd"
    APOLLO_ADAMW = "apollo_adamw"
    APOLLO_ADAMW_LAYERWISE = "apollo_adamw_layerwise"
    STABLE_ADAMW = "stable_adamw"


class ParallelMode(Enum):
    """How the model is spread over devices and processes."""

    NOT_PARALLEL = "not_parallel"
    NOT_DISTRIBUTED = "not_distributed"
    DISTRIBUTED = "distributed"
    SAGEMAKER_MODEL_PARALLEL = "sagemaker_model_parallel"
    SAGEMAKER_DATA_PARALLEL = "sagemaker_data_parallel"
    TPU = "tpu"


class FSDPOption(ExplicitEnum):
    """Words accepted by ``--fsdp``."""

    FULL_SHARD = "full_shard"
    SHARD_GRAD_OP = "shard_grad_op"
    NO_SHARD = "no_shard"
    HYBRID_SHARD = "hybrid_shard"
    HYBRID_SHARD_ZERO2 = "hybrid_shard_zero2"
    OFFLOAD = "offload"
    AUTO_WRAP = "auto_wrap"


class ShardedDDPOption(ExplicitEnum):
    """Words accepted by the deprecated ``--sharded_ddp``."""

    SIMPLE = "simple"
    ZERO_DP_2 = "zero_dp_2"
    ZERO_DP_3 = "zero_dp_3"
    OFFLOAD = "offload"
    AUTO_WRAP = "auto_wrap"


class TrainOutput(NamedTuple):
    """What ``Trainer.train`` returns."""

    global_step: int
    training_loss: float
    metrics: dict[str, float]


class EvalPrediction:
    """What ``compute_metrics`` receives: predictions, label ids and (optionally) the inputs.

    Unpacks like a tuple: ``preds, labels = eval_pred`` (or three values when inputs are included).
    """

    def __init__(self, predictions: Any, label_ids: Any, inputs: Any = None, losses: Any = None) -> None:
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses
        self._items = (predictions, label_ids) + ((inputs,) if inputs is not None else ())

    def __iter__(self):
        return iter(self._items)

    def __getitem__(self, idx: int) -> Any:
        return self._items[idx]

    def __len__(self) -> int:
        return len(self._items)


class EvalLoopOutput(NamedTuple):
    """What ``Trainer.evaluation_loop`` returns."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None
    num_samples: int | None


class PredictionOutput(NamedTuple):
    """What ``Trainer.predict`` returns."""

    predictions: Any
    label_ids: Any
    metrics: dict[str, float] | None


class BestRun(NamedTuple):
    """The best trial of a hyper-parameter search."""

    run_id: str
    objective: float | list[float]
    hyperparameters: dict[str, Any]
    run_summary: Any = None


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device); optionally turn on deterministic algorithms."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        enable_full_determinism(seed, warn_only=True)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed everything and ask torch for deterministic kernels (slower; for debugging distributed runs)."""
    import torch

    set_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    # as upstream's enable_full_determinism (transformers/trainer_utils.py): Ascend NPUs' deterministic mode and
    # flash-attention's deterministic backward (read by the flash_attn kernels transformers calls)
    os.environ["ASCEND_LAUNCH_BLOCKING"] = "1"
    os.environ["HCCL_DETERMINISTIC"] = "1"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int, num_workers: int = 0, rank: int = 0) -> None:
    """DataLoader ``worker_init_fn`` of the training loader (upstream's): seed python, numpy and torch in the worker
    with ``num_workers * rank`` plus torch's per-worker seed, so that the ranks' workers draw different numbers."""
    import torch

    set_seed(num_workers * rank + torch.initial_seed() % 2**32)


def is_checkpoint_name(name: str) -> int | None:
    """The step of a ``checkpoint-<step>`` folder name, or None for any other name."""
    match = _re_checkpoint.match(name)
    return int(match.group(1)) if match else None
