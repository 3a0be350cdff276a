"""Sequence classification on local json files, in the shape of upstream's text-classification/run_glue.py."""

import logging

import evaluate
import numpy as np
from datasets import load_dataset

from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    EvalPrediction,
    Trainer,
    default_data_collator,
    set_seed,
)

import example_common as common

logger = logging.getLogger("examples")


def main():
    model_args, data_args, training_args = common.parse_args()
    common.setup_logging(training_args)
    last_checkpoint = common.detect_last_checkpoint(training_args)
    set_seed(training_args.seed)

    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    if data_args.test_file:
        files["test"] = data_args.test_file
    raw = load_dataset("json", data_files=files)
    label_list = sorted(raw["train"].unique("label"))
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=len(label_list))
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, config=config)
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples):
        return tokenizer(examples["sentence"], padding=padding, max_length=data_args.max_seq_length,
                         truncation=True)

    with training_args.main_process_first(desc="dataset map pre-processing"):
        raw = raw.map(preprocess, batched=True, remove_columns=["sentence"], desc="Running tokenizer")
    train_dataset = common.cap(raw["train"], data_args.max_train_samples)
    eval_dataset = common.cap(raw["validation"], data_args.max_eval_samples)

    metric = evaluate.load("accuracy")

    def compute_metrics(p: EvalPrediction):
        preds = p.predictions[0] if isinstance(p.predictions, tuple) else p.predictions
        return metric.compute(predictions=np.argmax(preds, axis=1), references=p.label_ids)

    collator = default_data_collator if data_args.pad_to_max_length else DataCollatorWithPadding(tokenizer)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None, compute_metrics=compute_metrics,
                      processing_class=tokenizer, data_collator=collator)
    if training_args.do_train:
        common.train(trainer, training_args, last_checkpoint, train_dataset)
    if training_args.do_eval:
        common.evaluate(trainer, eval_dataset)
    if training_args.do_predict:
        logger.info("*** Predict ***")
        test = common.cap(raw["test"], data_args.max_predict_samples).remove_columns("label")
        predictions = np.argmax(trainer.predict(test, metric_key_prefix="predict").predictions, axis=1)
        if trainer.is_world_process_zero():
            with open(f"{training_args.output_dir}/predict_results.txt", "w") as writer:
                writer.write("index\tprediction\n")
                for index, item in enumerate(predictions):
                    writer.write(f"{index}\t{label_list[item]}\n")


if __name__ == "__main__":
    main()
