"""The string enums naming the values of the training options (``eval_strategy``, ``save_strategy``,
``lr_scheduler_type``, ``optim``, ``fsdp``, ...), each an :class:`ExplicitEnum` whose lookup error lists the valid
values."""

from __future__ import annotations

from enum import Enum
from typing import Any


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
    GREEDY = "greedy"


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

    def __eq__(self, other: object) -> bool:
        # equal to transformers' ParallelMode member of the same value too (a plain Enum there, compared by
        # identity): sentence-transformers' arguments test `self.parallel_mode == ParallelMode.DISTRIBUTED` to set
        # dataloader_drop_last=True on several processes
        if isinstance(other, Enum) and type(other).__name__ == "ParallelMode":
            return self.value == other.value
        return NotImplemented

    __hash__ = Enum.__hash__


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
