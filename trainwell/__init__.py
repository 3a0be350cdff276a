"""trainwell: a lean, fast, crash-safe training loop for PyTorch with the familiar Trainer API.

Public names are resolved lazily (PEP 562) so that ``import trainwell`` costs almost nothing beyond ``import torch``.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # trainer and arguments
    "Trainer": "trainer",
    "TrainingArguments": "args",
    "Seq2SeqTrainingArguments": "seq2seq_args",
    "Seq2SeqTrainer": "seq2seq",
    "ArgParser": "parser",
    "HfArgumentParser": "parser",
    # state and callbacks
    "TrainerState": "state",
    "TrainerControl": "state",
    "CallbackHandler": "events",
    "TrainerCallback": "callbacks",
    "DefaultFlowCallback": "callbacks",
    "ProgressCallback": "callbacks",
    "PrinterCallback": "callbacks",
    "EarlyStoppingCallback": "callbacks",
    "StopOnNonFiniteLossCallback": "callbacks",
    "TensorBoardCallback": "callbacks.integrations.tensorboard",
    "MLflowCallback": "callbacks.integrations.mlflow",
    "WandbCallback": "callbacks.integrations",
    "CometCallback": "callbacks.integrations",
    "ClearMLCallback": "callbacks.integrations",
    "NeptuneCallback": "callbacks.integrations",
    "DVCLiveCallback": "callbacks.integrations",
    "CodeCarbonCallback": "callbacks.integrations",
    "TrackioCallback": "callbacks.integrations",
    "SwanLabCallback": "callbacks.integrations",
    "AzureMLCallback": "callbacks.integrations",
    "DagsHubCallback": "callbacks.integrations",
    "FlyteCallback": "callbacks.integrations",
    "KubeflowCallback": "callbacks.integrations",
    # utilities and types
    "IntervalStrategy": "trainer_utils",
    "SaveStrategy": "trainer_utils",
    "SchedulerType": "trainer_utils",
    "OptimizerNames": "trainer_utils",
    "ParallelMode": "trainer_utils",
    "HubStrategy": "trainer_utils",
    "FSDPOption": "trainer_utils",
    "TrainOutput": "trainer_utils",
    "EvalPrediction": "trainer_utils",
    "EvalLoopOutput": "trainer_utils",
    "PredictionOutput": "trainer_utils",
    "set_seed": "trainer_utils",
    "enable_full_determinism": "trainer_utils",
    "get_last_checkpoint": "checkpoint.layout",
    # data
    "default_data_collator": "data.collators",
    "DataCollatorWithPadding": "data.collators",
    "DataCollatorForSeq2Seq": "data.collators",
    "DataCollatorForLanguageModeling": "data.collators",
    "DataCollatorForTokenClassification": "data.collators",
    "DefaultDataCollator": "data.collators",
    # optimisation
    "get_scheduler": "schedules",
    "get_linear_schedule_with_warmup": "schedules",
    "get_cosine_schedule_with_warmup": "schedules",
    "get_constant_schedule": "schedules",
    "get_constant_schedule_with_warmup": "schedules",
    "Adafactor": "optim",
    # DeepSpeed outside the Trainer (seed 001's non-Trainer integration)
    "HfDeepSpeedConfig": "backends.deepspeed.config",
    "is_deepspeed_zero3_enabled": "backends.deepspeed.config",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
