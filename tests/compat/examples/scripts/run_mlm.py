"""Masked language modelling on local text files, in the shape of upstream's language-modeling/run_mlm.py."""

from dataclasses import dataclass, field

from transformers import AutoModelForMaskedLM, AutoTokenizer, DataCollatorForLanguageModeling, Trainer, set_seed

import example_common as common
import lm_data


@dataclass
class MLMDataArguments(common.DataTrainingArguments):
    """The data arguments plus the masking ratio."""

    mlm_probability: float = field(default=0.15)


def main():
    model_args, data_args, training_args = common.parse_args(data_class=MLMDataArguments)
    common.setup_logging(training_args)
    last_checkpoint = common.detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path)
    train_dataset, eval_dataset = lm_data.load_blocks(tokenizer, data_args, training_args, labels=False)
    collator = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=data_args.mlm_probability)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None, processing_class=tokenizer,
                      data_collator=collator, compute_metrics=lm_data.accuracy_metrics(shift=False),
                      preprocess_logits_for_metrics=lm_data.preprocess_logits_for_metrics)
    if training_args.do_train:
        common.train(trainer, training_args, last_checkpoint, train_dataset)
    if training_args.do_eval:
        metrics = lm_data.add_perplexity(trainer.evaluate())
        metrics["eval_samples"] = len(eval_dataset)
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)


if __name__ == "__main__":
    main()
