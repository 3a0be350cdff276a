"""Extractive question answering on local squad-shaped json files, in the shape of upstream's
question-answering/run_qa.py (with its Trainer subclass in trainer_qa.py and post-processing in utils_qa.py)."""

import logging
from dataclasses import dataclass, field

import evaluate
from datasets import load_dataset

from transformers import AutoModelForQuestionAnswering, AutoTokenizer, EvalPrediction, default_data_collator, set_seed

import example_common as common
from trainer_qa import QuestionAnsweringTrainer
from utils_qa import postprocess_qa_predictions

logger = logging.getLogger("examples")


@dataclass
class QADataArguments(common.DataTrainingArguments):
    """The data arguments plus the stride between the windows of a long context."""

    doc_stride: int = field(default=8)


def main():
    model_args, data_args, training_args = common.parse_args(data_class=QADataArguments)
    common.setup_logging(training_args)
    last_checkpoint = common.detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    if data_args.test_file:
        files["test"] = data_args.test_file
    raw = load_dataset("json", data_files=files)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForQuestionAnswering.from_pretrained(model_args.model_name_or_path)
    max_len, columns = data_args.max_seq_length, raw["train"].column_names

    def windows(examples):
        return tokenizer(examples["question"], examples["context"], truncation="only_second", max_length=max_len,
                         stride=data_args.doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                         padding="max_length")

    def prepare_train(examples):
        tokenized = windows(examples)
        sample_map = tokenized.pop("overflow_to_sample_mapping")
        starts, ends = [], []
        for i, offsets in enumerate(tokenized.pop("offset_mapping")):
            cls = tokenized["input_ids"][i].index(tokenizer.cls_token_id)
            sequence = tokenized.sequence_ids(i)
            answer = examples["answers"][sample_map[i]]
            first = answer["answer_start"][0]
            last = first + len(answer["text"][0])
            context = [k for k, s in enumerate(sequence) if s == 1]
            if not context or offsets[context[0]][0] > first or offsets[context[-1]][1] < last:
                starts.append(cls)
                ends.append(cls)
                continue
            starts.append(next(k for k in context if offsets[k][1] > first))
            ends.append(next(k for k in reversed(context) if offsets[k][0] < last))
        tokenized["start_positions"], tokenized["end_positions"] = starts, ends
        return tokenized

    def prepare_eval(examples):
        tokenized = windows(examples)
        sample_map = tokenized.pop("overflow_to_sample_mapping")
        tokenized["example_id"] = []
        for i in range(len(tokenized["input_ids"])):
            sequence = tokenized.sequence_ids(i)
            tokenized["example_id"].append(examples["id"][sample_map[i]])
            tokenized["offset_mapping"][i] = [o if sequence[k] == 1 else None
                                              for k, o in enumerate(tokenized["offset_mapping"][i])]
        return tokenized

    with training_args.main_process_first(desc="dataset map pre-processing"):
        train_dataset = common.cap(raw["train"], data_args.max_train_samples).map(
            prepare_train, batched=True, remove_columns=columns)
        eval_examples = common.cap(raw["validation"], data_args.max_eval_samples)
        eval_dataset = eval_examples.map(prepare_eval, batched=True, remove_columns=columns)
        predict_examples = common.cap(raw["test"], data_args.max_predict_samples) if "test" in raw else None
        predict_dataset = (predict_examples.map(prepare_eval, batched=True, remove_columns=columns)
                           if predict_examples is not None else None)

    def post_processing_function(examples, features, predictions, stage="eval"):
        answers = postprocess_qa_predictions(examples, features, predictions, output_dir=training_args.output_dir,
                                             prefix=stage)
        formatted = [{"id": k, "prediction_text": v} for k, v in answers.items()]
        references = [{"id": ex["id"], "answers": ex["answers"]} for ex in examples]
        return EvalPrediction(predictions=formatted, label_ids=references)

    metric = evaluate.load("squad")

    def compute_metrics(p: EvalPrediction):
        return metric.compute(predictions=p.predictions, references=p.label_ids)

    trainer = QuestionAnsweringTrainer(
        model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
        eval_dataset=eval_dataset if training_args.do_eval else None, eval_examples=eval_examples,
        processing_class=tokenizer, data_collator=default_data_collator,
        post_process_function=post_processing_function, compute_metrics=compute_metrics)
    if training_args.do_train:
        common.train(trainer, training_args, last_checkpoint, train_dataset)
    if training_args.do_eval:
        common.evaluate(trainer, eval_examples)
    if training_args.do_predict:
        logger.info("*** Predict ***")
        results = trainer.predict(predict_dataset, predict_examples)
        metrics = results.metrics
        metrics["predict_samples"] = len(predict_examples)
        trainer.log_metrics("predict", metrics)
        trainer.save_metrics("predict", metrics)


if __name__ == "__main__":
    main()
