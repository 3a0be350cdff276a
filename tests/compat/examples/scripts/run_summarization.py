"""Summarization with a sequence-to-sequence model on local json files (``text``, ``summary``), in the shape of
upstream's summarization/run_summarization.py: Seq2SeqTrainer, ``--predict_with_generate``, rouge."""

import logging
from dataclasses import dataclass, field

import evaluate
import numpy as np
from datasets import load_dataset

from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

import example_common as common

logger = logging.getLogger("examples")


@dataclass
class SummarizationDataArguments(common.DataTrainingArguments):
    """The data arguments plus the target length, the beams and the source prefix."""

    max_target_length: int = field(default=8)
    num_beams: int = field(default=1)
    source_prefix: str = field(default="summarize: ")


def main():
    model_args, data_args, training_args = common.parse_args(Seq2SeqTrainingArguments,
                                                             SummarizationDataArguments)
    common.setup_logging(training_args)
    last_checkpoint = common.detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    if data_args.test_file:
        files["test"] = data_args.test_file
    raw = load_dataset("json", data_files=files)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path)
    padding = "max_length" if data_args.pad_to_max_length else False

    def preprocess(examples):
        inputs = [data_args.source_prefix + text for text in examples["text"]]
        model_inputs = tokenizer(inputs, max_length=data_args.max_seq_length, padding=padding, truncation=True)
        labels = tokenizer(text_target=examples["summary"], max_length=data_args.max_target_length,
                           padding=padding, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    with training_args.main_process_first(desc="dataset map pre-processing"):
        processed = raw.map(preprocess, batched=True, remove_columns=["text", "summary"])
    train_dataset = common.cap(processed["train"], data_args.max_train_samples)
    eval_dataset = common.cap(processed["validation"], data_args.max_eval_samples)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    metric = evaluate.load("rouge")

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_preds = [p.strip() for p in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        decoded_labels = [l.strip() for l in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        result = {k: round(v * 100, 4) for k, v in metric.compute(predictions=decoded_preds,
                                                                  references=decoded_labels).items()}
        lengths = [np.count_nonzero(p != tokenizer.pad_token_id) for p in preds]
        result["gen_len"] = float(np.mean(lengths))
        return result

    trainer = Seq2SeqTrainer(model=model, args=training_args,
                             train_dataset=train_dataset if training_args.do_train else None,
                             eval_dataset=eval_dataset if training_args.do_eval else None,
                             processing_class=tokenizer, data_collator=collator,
                             compute_metrics=compute_metrics if training_args.predict_with_generate else None)
    if training_args.do_train:
        common.train(trainer, training_args, last_checkpoint, train_dataset)
    gen = {"max_length": data_args.max_target_length, "num_beams": data_args.num_beams}
    if training_args.do_eval:
        common.evaluate(trainer, eval_dataset, metric_key_prefix="eval", **gen)
    if training_args.do_predict:
        logger.info("*** Predict ***")
        test = common.cap(processed["test"], data_args.max_predict_samples)
        results = trainer.predict(test, metric_key_prefix="predict", **gen)
        metrics = results.metrics
        metrics["predict_samples"] = len(test)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            preds = np.where(results.predictions != -100, results.predictions, tokenizer.pad_token_id)
            texts = [p.strip() for p in tokenizer.batch_decode(preds, skip_special_tokens=True)]
            with open(f"{training_args.output_dir}/generated_predictions.txt", "w") as writer:
                writer.write("\n".join(texts))


if __name__ == "__main__":
    main()
