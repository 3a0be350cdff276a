"""Evaluation scenarios run by ``test_eval_parity.py``: under torchrun (2 ranks) or as one plain process.

Usage: ``python eval_parity_job.py OUT_JSON WORKDIR [--upstream]``. Every scenario evaluates the same model (the same
initial weights in every process) on datasets of odd lengths with ragged sequences, under one evaluation option
(plain, ``eval_do_concat_batches=False``, ``batch_eval_metrics``, ``eval_accumulation_steps``,
``include_for_metrics``, ``dataloader_drop_last``, an ``IterableDataset``), through ``evaluate()`` and ``predict()``. Rank 0 writes one JSON
object: scenario name -> metrics, predictions and labels. With ``--upstream`` (one process only) the plain
scenarios also run through ``transformers.Trainer``, under the key ``upstream/<scenario>``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

torch.set_num_threads(1)

from jobs import finish  # noqa: E402
from trainwell import Trainer, TrainingArguments  # noqa: E402

VOCAB, CLASSES, HIDDEN = 11, 3, 6
LENGTHS = (1, 7, 37)
BATCH_SIZES = (1, 8)
OPTIONS: dict[str, dict[str, Any]] = {
    "plain": {},
    "no_concat": {"eval_do_concat_batches": False},
    "batch_metrics": {"batch_eval_metrics": True},
    "accumulation": {"eval_accumulation_steps": 2},
    "include": {"include_for_metrics": ["inputs", "loss"]},
    "drop_last": {"dataloader_drop_last": True},
    "iterable": {"_iterable": True},  # an IterableDataset: no sampler, every rank reads the whole stream
}


# dataloader_drop_last on a dataset smaller than a batch evaluates nothing; (29, 4) makes rank 1's last batch a
# placeholder of a whole batch.
DROP_LAST_SHAPES = ((37, 8), (29, 4), (7, 1))
UPSTREAM_OPTIONS = ("plain", "include", "drop_last", "no_concat", "iterable")


class TokenTagger(nn.Module):
    """Tags every token; the loss is the mean over the batch's labelled tokens (not a per-sample mean)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(torch.tanh(self.emb(input_ids)))
        out = {"logits": logits, "pooled": logits.mean(dim=1)}
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100)
            out = {"loss": loss, **out}
        return out


class Stream(torch.utils.data.IterableDataset):
    """The same items as an iterable dataset (no length, no sampler)."""

    def __init__(self, items: list[dict[str, torch.Tensor]]) -> None:
        self.items = items

    def __iter__(self) -> Any:
        return iter(self.items)


def make_dataset(n: int) -> list[dict[str, torch.Tensor]]:
    """``n`` sequences of lengths 1..5 (ragged), fixed by the seed."""
    g = torch.Generator().manual_seed(n)
    data = []
    for i in range(n):
        length = 1 + (i * 3) % 5
        data.append({"input_ids": torch.randint(1, VOCAB, (length,), generator=g),
                     "labels": torch.randint(0, CLASSES, (length,), generator=g)})
    return data


def collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad ``input_ids`` with 0 and ``labels`` with -100 to the longest sequence of the batch."""
    length = max(len(item["input_ids"]) for item in items)
    ids = torch.zeros(len(items), length, dtype=torch.long)
    labels = torch.full((len(items), length), -100, dtype=torch.long)
    for row, item in enumerate(items):
        ids[row, :len(item["input_ids"])] = item["input_ids"]
        labels[row, :len(item["labels"])] = item["labels"]
    return {"input_ids": ids, "labels": labels}


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


class Metrics:
    """compute_metrics: token accuracy, mean pooled score, and (when given) sums of the inputs and losses.

    Works on whole arrays and, with ``batch_eval_metrics``, batch by batch (summing until ``compute_result``).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.sums = {"correct": 0.0, "tokens": 0.0, "pooled": 0.0, "rows": 0.0, "inputs": 0.0, "losses": 0.0,
                     "loss_rows": 0.0}

    def __call__(self, pred: Any, compute_result: bool = True) -> dict[str, float] | None:
        if isinstance(pred.predictions, list):  # eval_do_concat_batches=False: a list of batches
            inputs = pred.inputs or [None] * len(pred.predictions)
            losses = pred.losses or [None] * len(pred.predictions)
            for batch in zip(pred.predictions, pred.label_ids, inputs, losses):
                self._add(*batch)
        else:
            self._add(pred.predictions, pred.label_ids, pred.inputs, pred.losses)
        if not compute_result:
            return None
        sums, _ = self.sums, self.reset()
        return {"accuracy": sums["correct"] / sums["tokens"], "pooled": sums["pooled"] / sums["rows"],
                "rows": sums["rows"], "inputs": sums["inputs"], "losses": sums["losses"],
                "loss_rows": sums["loss_rows"]}

    def _add(self, predictions: Any, label_ids: Any, inputs: Any, losses: Any) -> None:
        logits, pooled = (_np(x) for x in predictions)
        labels = _np(label_ids)
        mask = labels != -100
        self.sums["correct"] += float((logits[..., :labels.shape[1], :].argmax(-1) == labels)[mask].sum())
        self.sums["tokens"] += float(mask.sum())
        self.sums["pooled"] += float(pooled.sum())
        self.sums["rows"] += float(len(pooled))
        if inputs is not None:
            inputs = _np(inputs)
            self.sums["inputs"] += float(inputs[inputs > 0].sum())
        if losses is not None:
            self.sums["losses"] += float(_np(losses).astype(np.float64).sum())
            self.sums["loss_rows"] += float(_np(losses).size)


def _pad_rows(batches: list[np.ndarray]) -> np.ndarray:
    """Concatenate per-batch arrays, padding trailing dims with -100 (to compare a list of batches)."""
    trailing = tuple(max(b.shape[d] for b in batches) for d in range(1, batches[0].ndim))
    out = np.full((sum(len(b) for b in batches),) + trailing, -100, dtype=np.float64)
    row = 0
    for b in batches:
        out[(slice(row, row + len(b)),) + tuple(slice(0, s) for s in b.shape[1:])] = b
        row += len(b)
    return out


def _as_list(value: Any, concat: bool) -> Any:
    """Predictions/labels as JSON: concatenated arrays as they are, a list of batches concatenated here."""
    if value is None:
        return None
    if concat:
        return [v.tolist() for v in value] if isinstance(value, tuple) else value.tolist()
    if isinstance(value[0], tuple):
        return [_pad_rows([batch[k] for batch in value]).tolist() for k in range(len(value[0]))]
    return _pad_rows(list(value)).tolist()


def run_trainer(trainer_cls: type, args_cls: type, n: int, batch: int, option: str, out: str) -> dict[str, Any]:
    options = dict(OPTIONS[option])
    iterable = options.pop("_iterable", False)
    torch.manual_seed(0)
    model = TokenTagger()
    args = args_cls(output_dir=out, per_device_eval_batch_size=batch, report_to="none", use_cpu=True,
                    disable_tqdm=True, **options)
    metrics_fn = Metrics()
    trainer = trainer_cls(model=model, args=args, data_collator=collate, compute_metrics=metrics_fn)
    dataset = Stream(make_dataset(n)) if iterable else make_dataset(n)
    result: dict[str, Any] = {"evaluate": trainer.evaluate(dataset)}
    trainer.compute_metrics = None  # evaluate() then asks for the loss only (no predictions gathered)
    result["loss_only"] = trainer.evaluate(dataset)
    trainer.compute_metrics = metrics_fn
    metrics_fn.reset()
    output = trainer.predict(dataset)
    concat = options.get("eval_do_concat_batches", True)
    result["predict_metrics"] = output.metrics
    result["predictions"] = _as_list(output.predictions, concat)
    result["label_ids"] = _as_list(output.label_ids, concat)
    if not concat:
        result["batch_rows"] = [len(b[1] if isinstance(b, tuple) else b) for b in output.label_ids]
    return result


def scenarios() -> list[tuple[str, int, int]]:
    """(option, dataset length, per-device eval batch size) of every scenario, in the order they run."""
    grid = [(n, batch) for n in LENGTHS for batch in BATCH_SIZES]
    return [(option, n, batch) for option in OPTIONS for n, batch in (DROP_LAST_SHAPES if option == "drop_last"
                                                                      else grid)]


def main(argv: list[str]) -> None:
    out_json, workdir, upstream = Path(argv[0]), argv[1], "--upstream" in argv
    results: dict[str, Any] = {}
    for option, n, batch in scenarios():
        key = f"{option}/n={n}/bs={batch}"
        results[key] = run_trainer(Trainer, TrainingArguments, n, batch, option, workdir)
        if upstream and option in UPSTREAM_OPTIONS:
            import transformers

            results[f"upstream/{key}"] = run_trainer(transformers.Trainer, transformers.TrainingArguments,
                                                     n, batch, option, workdir)
    finish(out_json, results)


if __name__ == "__main__":
    main(sys.argv[1:])
