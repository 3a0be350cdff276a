"""Causal language modelling on local text files, in the shape of upstream's language-modeling/run_clm.py."""

from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, default_data_collator, set_seed

import example_common as common
import lm_data


def main():
    model_args, data_args, training_args = common.parse_args()
    common.setup_logging(training_args)
    last_checkpoint = common.detect_last_checkpoint(training_args)
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    train_dataset, eval_dataset = lm_data.load_blocks(tokenizer, data_args, training_args, labels=True)
    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None, processing_class=tokenizer,
                      data_collator=default_data_collator, compute_metrics=lm_data.accuracy_metrics(shift=True),
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
