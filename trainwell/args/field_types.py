"""The types of the ``TrainingArguments`` fields that its mixins (:mod:`.validate`, :mod:`.runtime`) read.

Declared for the type checker only (``TYPE_CHECKING``): at run time the class is empty, so the dataclass's fields,
defaults and annotations stay those of :mod:`.fields`, the one reference. Each type here is the one fields.py
declares (the value as given, before ``__post_init__`` converts it); mypy checks that fields.py's declarations still
match them, and a mixin narrows a value it reads after ``__post_init__`` has converted it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from dataclasses import Field

    from ..utils.option_enums import (
        FSDPOption,
        HubStrategy,
        IntervalStrategy,
        OptimizerNames,
        SaveStrategy,
        SchedulerType,
        ShardedDDPOption,
    )


class FieldTypes:
    """Base of the ``TrainingArguments`` mixins: the fields they read, typed as fields.py declares them."""

    if TYPE_CHECKING:
        __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # TrainingArguments is a dataclass
        _VALID_DICT_FIELDS: ClassVar[list[str]]
        output_dir: str | None
        do_eval: bool
        eval_strategy: IntervalStrategy | str
        per_device_train_batch_size: int
        per_device_eval_batch_size: int
        gradient_accumulation_steps: int
        eval_accumulation_steps: int | None
        torch_empty_cache_steps: int | None
        learning_rate: float
        weight_decay: float
        adam_beta1: float
        adam_beta2: float
        num_train_epochs: float
        max_steps: int
        lr_scheduler_type: SchedulerType | str
        lr_scheduler_kwargs: dict | str | None
        warmup_ratio: float | None
        warmup_steps: float
        log_level: str
        log_level_replica: str
        log_on_each_node: bool
        logging_dir: str | None
        logging_strategy: IntervalStrategy | str
        logging_steps: float
        save_strategy: SaveStrategy | str
        save_steps: float
        save_total_limit: int | None
        save_on_each_node: bool
        use_cpu: bool
        use_mps_device: bool
        jit_mode_eval: bool
        use_ipex: bool
        bf16: bool
        fp16: bool
        half_precision_backend: str
        bf16_full_eval: bool
        fp16_full_eval: bool
        tf32: bool | None
        local_rank: int
        tpu_num_cores: int | None
        tpu_metrics_debug: bool
        debug: str | list[Any]  # list[DebugOption]: DebugOption lives in .validate, which imports this module
        eval_steps: float | None
        dataloader_num_workers: int
        dataloader_prefetch_factor: int | None
        dataloader_multiprocessing_context: str | None
        train_sampling_strategy: str
        run_name: str | None
        disable_tqdm: bool | None
        load_best_model_at_end: bool | None
        metric_for_best_model: str | None
        greater_is_better: bool | None
        fsdp: list[FSDPOption] | str | None
        fsdp_min_num_params: int
        fsdp_config: dict | str | None
        fsdp_transformer_layer_cls_to_wrap: str | None
        sharded_ddp: list[ShardedDDPOption] | str | None
        accelerator_config: dict | str | None
        parallelism_config: Any
        deepspeed: dict | str | None
        label_smoothing_factor: float
        optim: OptimizerNames | str
        adafactor: bool
        report_to: None | str | list[str]
        dataloader_pin_memory: bool
        hub_model_id: str | None
        hub_strategy: HubStrategy | str
        activation_checkpointing: bool | None
        gradient_checkpointing: bool | None
        include_inputs_for_metrics: bool
        include_for_metrics: list[str]
        push_to_hub_organization: str | None
        mp_parameters: str
        ddp_timeout: int
        torch_compile: bool
        torch_compile_backend: str | None
        torch_compile_mode: str | None
        optim_target_modules: None | str | list[str]
        use_liger_kernel: bool | None
