"""trainwell: a lean, fast, crash-safe training loop for PyTorch with the familiar Trainer API.

Public names are resolved lazily (PEP 562) so that ``import trainwell`` costs almost nothing beyond ``import torch``.
"""

from __future__ import annotations

from typing import Any

from .utils.lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # trainer and arguments
    "Trainer": "trainer.trainer",
    "TrainingArguments": "args.fields",
    "Seq2SeqTrainingArguments": "args.seq2seq",
    "Seq2SeqTrainer": "trainer.seq2seq",
    "ArgParser": "args.parser",
    "HfArgumentParser": "args.parser",
    # state and callbacks
    "TrainerState": "utils.trainer_state",
    "TrainerControl": "utils.trainer_state",
    "CallbackHandler": "callbacks.events",
    "ExportableState": "utils.trainer_state",
    "TrainerCallback": "callbacks",
    "DefaultFlowCallback": "callbacks",
    "ProgressCallback": "callbacks",
    "PrinterCallback": "callbacks",
    "EarlyStoppingCallback": "callbacks",
    "StopOnNonFiniteLossCallback": "callbacks",
    # utilities and types
    "IntervalStrategy": "utils.option_enums",
    "SaveStrategy": "utils.option_enums",
    "SchedulerType": "utils.option_enums",
    "OptimizerNames": "utils.option_enums",
    "ParallelMode": "utils.option_enums",
    "HubStrategy": "utils.option_enums",
    "FSDPOption": "utils.option_enums",
    "TrainOutput": "utils.outputs",
    "EvalPrediction": "utils.outputs",
    "EvalLoopOutput": "utils.outputs",
    "PredictionOutput": "utils.outputs",
    "set_seed": "utils.seeding",
    "enable_full_determinism": "utils.seeding",
    "get_last_checkpoint": "checkpoint.layout",
    "TrainingPreempted": "checkpoint.preemption",
    # data
    "default_data_collator": "data.collators",
    "DataCollatorWithPadding": "data.collators",
    "DataCollatorForSeq2Seq": "data.collators",
    "DataCollatorForLanguageModeling": "data.collators",
    "DataCollatorForTokenClassification": "data.collators",
    "DefaultDataCollator": "data.collators",
    "DataCollator": "data.collators",
    "DataCollatorWithFlattening": "data.flattening",
    "DataCollatorForMultipleChoice": "data.multiple_choice",
    "LabelSmoother": "utils.losses",
    # optimisation
    "get_scheduler": "optim.schedules",
    "get_linear_schedule_with_warmup": "optim.schedules",
    "get_cosine_schedule_with_warmup": "optim.schedules",
    "get_constant_schedule": "optim.schedules",
    "get_constant_schedule_with_warmup": "optim.schedules",
    "get_cosine_with_hard_restarts_schedule_with_warmup": "optim.schedules",
    "get_cosine_with_min_lr_schedule_with_warmup": "optim.schedules",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate": "optim.schedules",
    "get_polynomial_decay_schedule_with_warmup": "optim.schedules",
    "get_inverse_sqrt_schedule": "optim.schedules",
    "get_reduce_on_plateau_schedule": "optim.schedules",
    "get_wsd_schedule": "optim.schedules",
    "TYPE_TO_SCHEDULER_FUNCTION": "optim.schedules",
    "GreedyLR": "optim.greedy",
    "StreamingAverage": "optim.greedy",
    "get_greedy_schedule": "optim.greedy",
    "AdafactorSchedule": "optim.adafactor_schedule",
    "get_adafactor_schedule": "optim.adafactor_schedule",
    "Adafactor": "optim.factory",
    # DeepSpeed outside the Trainer (upstream's non-Trainer integration: a model built under ZeRO-3)
    "HfDeepSpeedConfig": "backends.deepspeed.config",
    "is_deepspeed_zero3_enabled": "backends.deepspeed.config",
    # libraries built on transformers.Trainer (TRL, sentence-transformers, setfit) run on trainwell
    "patch_transformers": "compat.patch",
}

_lazy_getattr, _lazy_dir = lazy_exports(__name__, _EXPORTS)


def _add_tracker_callbacks() -> None:
    """The experiment trackers' callbacks (``WandbCallback``, ...) join the exports from their table
    (``utils/tracker_table.py``) the first time they or ``__all__`` are asked for: ``import trainwell`` reads no table."""
    if "__all__" not in globals():
        from .utils.tracker_table import callback_exports

        _EXPORTS.update(callback_exports(__name__))
        globals()["__all__"] = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (PEP 562); ``__all__`` and the trackers' callbacks read their table."""
    if name == "__all__" or name not in _EXPORTS:
        _add_tracker_callbacks()
        if name == "__all__":
            return globals()["__all__"]
    return _lazy_getattr(name)


def __dir__() -> list[str]:
    _add_tracker_callbacks()
    return _lazy_dir()
