"""What every example script here shares, written the way upstream's example scripts do it: the model/data argument
dataclasses, the logging set-up, the last-checkpoint detection, and the train / evaluate / predict blocks that log and
save their metrics. Imported by the scripts beside it (and ported with them: its ``transformers`` imports are the
trainer-side ones too).
"""

import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import datasets
import transformers
from transformers import HfArgumentParser, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger("examples")


@dataclass
class ModelArguments:
    """Which model and tokenizer to fine-tune."""

    model_name_or_path: str = field(metadata={"help": "Folder of the model (and its tokenizer)."})


@dataclass
class DataTrainingArguments:
    """Which local files to train, evaluate and predict on, and how much of them."""

    train_file: Optional[str] = field(default=None)
    validation_file: Optional[str] = field(default=None)
    test_file: Optional[str] = field(default=None)
    max_seq_length: int = field(default=32)
    pad_to_max_length: bool = field(default=False)
    max_train_samples: Optional[int] = field(default=None)
    max_eval_samples: Optional[int] = field(default=None)
    max_predict_samples: Optional[int] = field(default=None)


def parse_args(args_class=TrainingArguments, data_class=DataTrainingArguments):
    """(model_args, data_args, training_args) from the command line or from a single .json argument."""
    parser = HfArgumentParser((ModelArguments, data_class, args_class))
    if len(sys.argv) == 2 and sys.argv[1].endswith(".json"):
        return parser.parse_json_file(json_file=os.path.abspath(sys.argv[1]))
    return parser.parse_args_into_dataclasses()


def setup_logging(training_args) -> None:
    """Upstream's logging block: INFO from transformers when this process should log, then the process's level."""
    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        datefmt="%m/%d/%Y %H:%M:%S", handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.enable_default_handler()
    transformers.utils.logging.enable_explicit_format()
    logger.warning(f"Process rank: {training_args.local_rank}, device: {training_args.device}, "
                   f"n_gpu: {training_args.n_gpu}, distributed training: {training_args.parallel_mode.value}")
    logger.info(f"Training/evaluation parameters {training_args}")


def detect_last_checkpoint(training_args) -> Optional[str]:
    """The newest checkpoint in output_dir to resume from (none with --overwrite_output_dir, where it exists)."""
    overwrite = getattr(training_args, "overwrite_output_dir", False)
    if not (os.path.isdir(training_args.output_dir) and training_args.do_train and not overwrite):
        return None
    last_checkpoint = get_last_checkpoint(training_args.output_dir)
    if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
        logger.info(f"Checkpoint detected, resuming training at {last_checkpoint}.")
    return last_checkpoint


def cap(dataset, limit):
    """The first ``limit`` rows of ``dataset`` (all of them without a limit)."""
    return dataset if limit is None else dataset.select(range(min(limit, len(dataset))))


def train(trainer, training_args, last_checkpoint, train_dataset) -> None:
    """Train (resuming where asked or found), save the model, log and save the train metrics and the state."""
    checkpoint = training_args.resume_from_checkpoint or last_checkpoint
    result = trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    metrics = result.metrics
    metrics["train_samples"] = len(train_dataset)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()


def evaluate(trainer, eval_dataset, **kwargs) -> dict:
    """Evaluate, add the sample count, log and save the eval metrics."""
    logger.info("*** Evaluate ***")
    metrics = trainer.evaluate(**kwargs)
    metrics["eval_samples"] = len(eval_dataset)
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return metrics
