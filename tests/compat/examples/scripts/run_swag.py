"""Multiple choice (a context, four endings, the right one's index) on local json files, in the shape of upstream's
multiple-choice/run_swag.py, with its own padding collator for the choices."""

from dataclasses import dataclass

import numpy as np
import torch
from datasets import load_dataset

from transformers import AutoModelForMultipleChoice, AutoTokenizer, Trainer, set_seed

import example_common as common

ENDINGS = [f"ending{i}" for i in range(4)]


@dataclass
class DataCollatorForMultipleChoice:
    """Pads every choice of every example to the longest in the batch and stacks them as (batch, choices, length)."""

    tokenizer: object

    def __call__(self, features):
        labels = torch.tensor([f.pop("label") for f in features], dtype=torch.int64)
        choices = len(features[0]["input_ids"])
        flat = [{k: v[i] for k, v in f.items()} for f in features for i in range(choices)]
        batch = self.tokenizer.pad(flat, padding=True, return_tensors="pt")
        batch = {k: v.view(len(features), choices, -1) for k, v in batch.items()}
        batch["labels"] = labels
        return batch


def main():
    model_args, data_args, training_args = common.parse_args()
    common.setup_logging(training_args)
    last_checkpoint = common.detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    raw = load_dataset("json", data_files={"train": data_args.train_file, "validation": data_args.validation_file})
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForMultipleChoice.from_pretrained(model_args.model_name_or_path)

    def preprocess(examples):
        first = [[context] * 4 for context in examples["sent1"]]
        second = [[f"{head} {examples[e][i]}" for e in ENDINGS] for i, head in enumerate(examples["sent2"])]
        tokenized = tokenizer(sum(first, []), sum(second, []), truncation=True, max_length=data_args.max_seq_length)
        return {k: [v[i:i + 4] for i in range(0, len(v), 4)] for k, v in tokenized.items()}

    with training_args.main_process_first(desc="dataset map pre-processing"):
        processed = raw.map(preprocess, batched=True, remove_columns=["sent1", "sent2", *ENDINGS])
    train_dataset = common.cap(processed["train"], data_args.max_train_samples)
    eval_dataset = common.cap(processed["validation"], data_args.max_eval_samples)

    def compute_metrics(eval_predictions):
        predictions, label_ids = eval_predictions
        return {"accuracy": (np.argmax(predictions, axis=1) == label_ids).astype(np.float32).mean().item()}

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None, processing_class=tokenizer,
                      data_collator=DataCollatorForMultipleChoice(tokenizer), compute_metrics=compute_metrics)
    if training_args.do_train:
        common.train(trainer, training_args, last_checkpoint, train_dataset)
    if training_args.do_eval:
        common.evaluate(trainer, eval_dataset)


if __name__ == "__main__":
    main()
