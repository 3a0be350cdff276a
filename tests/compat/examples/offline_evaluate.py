"""A stand-in for the ``evaluate`` package, so the example scripts' ``evaluate.load(name)`` works offline.

The loader puts this module in ``sys.modules["evaluate"]`` before a script runs (the real package downloads each
metric's code from the hub). Each metric implements the definition its hub script documents, for the inputs the
example scripts pass: ``accuracy``, ``seqeval`` (entity-level IOB2 scores), ``squad`` (exact match and token F1, in
percent) and ``rouge`` (F-measure of unigram, bigram and longest-common-subsequence overlap, on lowercased alphanumeric tokens).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Callable, Iterable, Sequence

__all__ = ["load"]


class Metric:
    """What ``evaluate.load`` returns: ``compute(predictions=..., references=..., **options)``."""

    def __init__(self, name: str, fn: Callable[..., dict[str, Any]]) -> None:
        self.name = name
        self._fn = fn

    def compute(self, *, predictions: Sequence[Any], references: Sequence[Any], **options: Any) -> dict[str, Any]:
        """The metric's scores for these predictions against these references."""
        return self._fn(list(predictions), list(references), **options)


def _accuracy(predictions: list[Any], references: list[Any], **_: Any) -> dict[str, float]:
    hits = sum(int(p) == int(r) for p, r in zip(predictions, references))
    return {"accuracy": float(hits / len(references))}


def _entities(tags: Iterable[str]) -> set[tuple[str, int, int]]:
    """(type, start, end) of each IOB2 chunk; an ``I-`` that does not continue a chunk starts one (seqeval's
    default, lenient mode)."""
    found, kind, start = set(), None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-")
        if kind is not None and (prefix != "I" or label != kind):
            found.add((kind, start, i))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = label, i
    return found


def _seqeval(predictions: list[list[str]], references: list[list[str]], **_: Any) -> dict[str, Any]:
    pred = {(n, *e) for n, seq in enumerate(predictions) for e in _entities(seq)}
    gold = {(n, *e) for n, seq in enumerate(references) for e in _entities(seq)}
    out: dict[str, Any] = {}
    for kind in sorted({e[1] for e in gold | pred}):
        p = {e for e in pred if e[1] == kind}
        g = {e for e in gold if e[1] == kind}
        out[kind] = {**_prf(len(p & g), len(p), len(g)), "number": len(g)}
    total = _prf(len(pred & gold), len(pred), len(gold))
    tokens = [(a, b) for ps, rs in zip(predictions, references) for a, b in zip(ps, rs)]
    return {**out, **{f"overall_{k}": v for k, v in total.items()},
            "overall_accuracy": sum(a == b for a, b in tokens) / max(len(tokens), 1)}


def _prf(hits: int, predicted: int, gold: int) -> dict[str, float]:
    precision = hits / predicted if predicted else 0.0
    recall = hits / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


def _normalize(text: str) -> list[str]:
    text = "".join(c for c in text.lower() if c not in set(string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", text).split()


def _squad(predictions: list[dict], references: list[dict], **_: Any) -> dict[str, float]:
    gold = {r["id"]: r["answers"]["text"] for r in references}
    exact = f1 = 0.0
    for pred in predictions:
        answers = gold[pred["id"]]
        guess = _normalize(pred["prediction_text"])
        exact += max(float(guess == _normalize(a)) for a in answers)
        f1 += max(_token_f1(guess, _normalize(a)) for a in answers)
    return {"exact_match": 100.0 * exact / len(predictions), "f1": 100.0 * f1 / len(predictions)}


def _token_f1(guess: list[str], truth: list[str]) -> float:
    common = sum((collections.Counter(guess) & collections.Counter(truth)).values())
    return _prf(common, len(guess), len(truth))["f1"] if common else 0.0


def _rouge_tokens(text: str) -> list[str]:
    """rouge_score's default tokenizer: lowercase, anything but letters and digits separates tokens."""
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).split()


def _ngrams(tokens: list[str], n: int) -> collections.Counter:
    return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def _lcs(a: list[str], b: list[str]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], prev + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def _rouge(predictions: list[str], references: list[str], use_stemmer: bool = False, **_: Any) -> dict[str, float]:
    scores: dict[str, float] = {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0, "rougeLsum": 0.0}
    for pred, ref in zip(predictions, references):
        p, r = _rouge_tokens(pred), _rouge_tokens(ref)
        for n in (1, 2):
            scores[f"rouge{n}"] += _prf(sum((_ngrams(p, n) & _ngrams(r, n)).values()),
                                        max(len(p) - n + 1, 0), max(len(r) - n + 1, 0))["f1"]
        lcs = _prf(_lcs(p, r), len(p), len(r))["f1"]
        scores["rougeL"] += lcs
        scores["rougeLsum"] += lcs
    return {k: v / max(len(predictions), 1) for k, v in scores.items()}


_METRICS = {"accuracy": _accuracy, "seqeval": _seqeval, "squad": _squad, "rouge": _rouge}


def load(path: str, *_: Any, **__: Any) -> Metric:
    """The metric named ``path``; an unknown name raises naming the ones this stand-in has."""
    if path not in _METRICS:
        raise ValueError(f"offline evaluate stand-in: no metric {path!r}; it has {sorted(_METRICS)} "
                         f"(add one to {__file__})")
    return Metric(path, _METRICS[path])
