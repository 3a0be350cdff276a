"""The language-modelling scripts' data preparation, as upstream's run_clm.py / run_mlm.py do it: tokenize every line,
concatenate, cut into blocks of ``max_seq_length`` tokens (the remainder dropped), and the metrics on the argmax."""

import math

import evaluate
from datasets import load_dataset

import example_common as common


def load_blocks(tokenizer, data_args, training_args, *, labels: bool):
    """The train and validation splits as blocks of ``data_args.max_seq_length`` tokens (with ``labels`` a copy of
    the input ids, for the causal LM)."""
    files = {"train": data_args.train_file, "validation": data_args.validation_file}
    raw = load_dataset("text", data_files=files)
    block = data_args.max_seq_length

    def tokenize(examples):
        return tokenizer(examples["text"], return_special_tokens_mask=not labels)

    def group(examples):
        joined = {k: sum(examples[k], []) for k in examples.keys()}
        total = (len(joined[list(examples.keys())[0]]) // block) * block
        out = {k: [t[i:i + block] for i in range(0, total, block)] for k, t in joined.items()}
        if labels:
            out["labels"] = [ids.copy() for ids in out["input_ids"]]
        return out

    with training_args.main_process_first(desc="grouping texts together"):
        tokenized = raw.map(tokenize, batched=True, remove_columns=["text"], desc="Running tokenizer on dataset")
        grouped = tokenized.map(group, batched=True, desc=f"Grouping texts in chunks of {block}")
    return (common.cap(grouped["train"], data_args.max_train_samples),
            common.cap(grouped["validation"], data_args.max_eval_samples))


def preprocess_logits_for_metrics(logits, labels):
    """Keep only the argmax, so evaluation does not accumulate the full logits."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def accuracy_metrics(*, shift: bool):
    """compute_metrics: the accuracy of the predicted tokens where a label is set (shifted by one for a causal LM)."""
    metric = evaluate.load("accuracy")

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if shift:
            preds, labels = preds[:, :-1], labels[:, 1:]
        mask = labels != -100
        return metric.compute(predictions=preds[mask].reshape(-1), references=labels[mask].reshape(-1))

    return compute_metrics


def add_perplexity(metrics: dict) -> dict:
    """``perplexity = exp(eval_loss)`` (inf on overflow), as the scripts report it."""
    try:
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
    except OverflowError:
        metrics["perplexity"] = float("inf")
    return metrics
