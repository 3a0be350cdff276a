"""The suite's own tools, without starting a process: the mechanical port of the trainer-side imports, and the
offline stand-ins of the scripts' metrics (checked against hand-computed values)."""

from __future__ import annotations

import ast

import pytest

import offline_evaluate
from run_example import port_source

SOURCE = '''import transformers
from transformers import (
    AutoConfig,
    Trainer as T,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint, PredictionOutput
from transformers.utils import check_min_version
x = 1
'''


def test_port_moves_only_trainwell_names_and_keeps_line_numbers():
    """Names trainwell provides come from trainwell (aliases kept), the rest stay with transformers, other modules
    are untouched, and every later line keeps its number."""
    ported = port_source(SOURCE)
    assert len(ported.splitlines()) == len(SOURCE.splitlines())
    assert ported.splitlines()[-1] == "x = 1"
    imports = {(node.module, alias.name, alias.asname) for node in ast.walk(ast.parse(ported))
               if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imports == {("trainwell", "Trainer", "T"), ("trainwell", "TrainingArguments", None),
                       ("transformers", "AutoConfig", None),
                       ("trainwell.trainer_utils", "get_last_checkpoint", None),
                       ("trainwell.trainer_utils", "PredictionOutput", None),
                       ("transformers.utils", "check_min_version", None)}


def test_port_leaves_a_file_without_trainer_imports_as_it_is():
    source = "from transformers import AutoConfig\nimport os\n"
    assert port_source(source) == source


def test_accuracy_and_squad():
    assert offline_evaluate.load("accuracy").compute(predictions=[0, 1, 1, 0], references=[0, 1, 0, 0]) == {
        "accuracy": 0.75}
    squad = offline_evaluate.load("squad").compute(
        predictions=[{"id": "a", "prediction_text": "The cat sat"}, {"id": "b", "prediction_text": "dog"}],
        references=[{"id": "a", "answers": {"text": ["cat sat"], "answer_start": [4]}},
                    {"id": "b", "answers": {"text": ["a red dog"], "answer_start": [0]}}])
    # "the" is dropped by the normalisation: a exact; b: 1 common of 1 predicted and 2 true tokens, F1 = 2/3
    assert squad == pytest.approx({"exact_match": 50.0, "f1": 100 * (1 + 2 / 3) / 2})


def test_seqeval_counts_entities_not_tokens():
    refs = [["B-CAP", "I-CAP", "O", "B-CAP"]]
    preds = [["B-CAP", "O", "O", "B-CAP"]]
    out = offline_evaluate.load("seqeval").compute(predictions=preds, references=refs)
    # one of two predicted entities is exact (the second); the first is cut short
    assert out["overall_precision"] == 0.5 and out["overall_recall"] == 0.5
    assert out["overall_accuracy"] == 0.75
    assert out["CAP"]["number"] == 2


def test_rouge_unigram_bigram_and_lcs():
    out = offline_evaluate.load("rouge").compute(predictions=["a b c d"], references=["a b d"])
    assert out["rouge1"] == pytest.approx(2 * 3 / 7)  # P 3/4, R 3/3
    assert out["rouge2"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))  # "a b" of 3 and 2 bigrams
    assert out["rougeL"] == pytest.approx(2 * 3 / 7)  # LCS "a b d"


def test_unknown_metric_names_the_known_ones():
    with pytest.raises(ValueError, match="accuracy"):
        offline_evaluate.load("bleu")
