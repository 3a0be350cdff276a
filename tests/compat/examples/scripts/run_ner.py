"""Token classification on local json files (``tokens``, ``ner_tags``), in the shape of upstream's
token-classification/run_ner.py."""

import logging

import evaluate
import numpy as np
from datasets import load_dataset

from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    AutoTokenizer,
    DataCollatorForTokenClassification,
    Trainer,
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
    label_list = sorted({tag for tags in raw["train"]["ner_tags"] for tag in tags})
    label_to_id = {label: i for i, label in enumerate(label_list)}
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, num_labels=len(label_list),
                                        label2id=label_to_id, id2label=dict(enumerate(label_list)))
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForTokenClassification.from_pretrained(model_args.model_name_or_path, config=config)
    padding = "max_length" if data_args.pad_to_max_length else False

    def tokenize_and_align_labels(examples):
        tokenized = tokenizer(examples["tokens"], padding=padding, truncation=True,
                              max_length=data_args.max_seq_length, is_split_into_words=True)
        labels = []
        for i, tags in enumerate(examples["ner_tags"]):
            previous, ids = None, []
            for word in tokenized.word_ids(batch_index=i):
                ids.append(-100 if word is None or word == previous else label_to_id[tags[word]])
                previous = word
            labels.append(ids)
        tokenized["labels"] = labels
        return tokenized

    with training_args.main_process_first(desc="dataset map pre-processing"):
        processed = raw.map(tokenize_and_align_labels, batched=True, remove_columns=raw["train"].column_names)
    train_dataset = common.cap(processed["train"], data_args.max_train_samples)
    eval_dataset = common.cap(processed["validation"], data_args.max_eval_samples)
    metric = evaluate.load("seqeval")

    def named(predictions, labels):
        preds = [[label_list[p] for p, l in zip(pr, lb) if l != -100] for pr, lb in zip(predictions, labels)]
        golds = [[label_list[l] for p, l in zip(pr, lb) if l != -100] for pr, lb in zip(predictions, labels)]
        return preds, golds

    def compute_metrics(p):
        preds, golds = named(np.argmax(p.predictions, axis=2), p.label_ids)
        results = metric.compute(predictions=preds, references=golds)
        return {key: results[f"overall_{key}"] for key in ("precision", "recall", "f1", "accuracy")}

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None, processing_class=tokenizer,
                      data_collator=DataCollatorForTokenClassification(tokenizer), compute_metrics=compute_metrics)
    if training_args.do_train:
        common.train(trainer, training_args, last_checkpoint, train_dataset)
    if training_args.do_eval:
        common.evaluate(trainer, eval_dataset)
    if training_args.do_predict:
        logger.info("*** Predict ***")
        test = common.cap(processed["test"], data_args.max_predict_samples)
        predictions, labels, metrics = trainer.predict(test, metric_key_prefix="predict")
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        preds, _ = named(np.argmax(predictions, axis=2), labels)
        if trainer.is_world_process_zero():
            with open(f"{training_args.output_dir}/predictions.txt", "w") as writer:
                for prediction in preds:
                    writer.write(" ".join(prediction) + "\n")


if __name__ == "__main__":
    main()
