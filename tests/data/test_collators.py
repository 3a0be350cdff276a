"""Collators: stacking, label renaming and dtypes, padding sides and multiples, seq2seq labels, LM labels."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trainwell.data.collators import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    DefaultDataCollator,
    default_data_collator,
    pad_sequences,
)

torch.set_num_threads(1)


class ToyTokenizer:
    """A tokenizer without ``pad``: exercises the built-in padding."""

    def __init__(self, pad_token_id=0, padding_side="right", mask_token_id=None, vocab=50):
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        self.mask_token_id = mask_token_id
        self.all_special_ids = [pad_token_id] if pad_token_id is not None else []
        self._vocab = vocab

    def __len__(self):
        return self._vocab


def test_default_collator_tensors_and_int_labels():
    features = [{"x": torch.tensor([1.0, 2.0]), "label": 1}, {"x": torch.tensor([3.0, 4.0]), "label": 0}]
    batch = default_data_collator(features)
    assert set(batch) == {"x", "labels"}
    assert torch.equal(batch["x"], torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]


def test_default_collator_numpy_lists_float_labels_drops_none_and_str():
    features = [
        {"a": np.array([1, 2]), "b": [5, 6], "label": 0.5, "text": "hi", "extra": None},
        {"a": np.array([3, 4]), "b": [7, 8], "label": 1.5, "text": "yo", "extra": None},
    ]
    batch = default_data_collator(features)
    assert set(batch) == {"a", "b", "labels"}
    assert batch["a"].tolist() == [[1, 2], [3, 4]] and isinstance(batch["a"], torch.Tensor)
    assert batch["b"].tolist() == [[5, 6], [7, 8]]
    assert batch["labels"].dtype == torch.float32 and batch["labels"].tolist() == [0.5, 1.5]


def test_default_collator_label_ids_objects_and_numpy_output():
    @dataclass
    class Ex:
        input_ids: list
        label_ids: list

    batch = default_data_collator([Ex([1, 2], [0, 1]), Ex([3, 4], [1, 1])])
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [[0, 1], [1, 1]]
    out = DefaultDataCollator(return_tensors="np")([{"x": 1, "label": np.int64(2)}, {"x": 2, "label": np.int64(3)}])
    assert isinstance(out["x"], np.ndarray) and out["labels"].dtype == np.int64
    tensor_labels = default_data_collator([SimpleNamespace(label=torch.tensor(2)), SimpleNamespace(label=torch.tensor(1))])
    assert tensor_labels["labels"].dtype == torch.long and tensor_labels["labels"].tolist() == [2, 1]


def test_default_collator_errors():
    with pytest.raises(ValueError, match="empty"):
        default_data_collator([])
    with pytest.raises(ValueError, match="'ids'"):
        default_data_collator([{"ids": [1, 2]}, {"ids": [1]}])
    with pytest.raises(ValueError, match="return_tensors"):
        default_data_collator([{"x": 1}], return_tensors="tf")


def test_pad_sequences_sides_and_multiple():
    right = pad_sequences([[1, 2, 3], [4]], padding_value=9)
    assert right.tolist() == [[1, 2, 3], [4, 9, 9]]
    left = pad_sequences([torch.tensor([1, 2, 3]), torch.tensor([4])], 0, side="left", pad_to_multiple_of=4)
    assert left.tolist() == [[0, 1, 2, 3], [0, 0, 0, 4]]
    assert pad_sequences([[1]], 0, max_length=3).tolist() == [[1, 0, 0]]
    with pytest.raises(ValueError, match="side"):
        pad_sequences([[1]], 0, side="middle")


def test_padding_collator_right_and_labels():
    collator = DataCollatorWithPadding(ToyTokenizer(pad_token_id=7))
    batch = collator([
        {"input_ids": [1, 2, 3], "attention_mask": [1, 1, 1], "token_type_ids": [0, 0, 1], "label": 1},
        {"input_ids": [4], "attention_mask": [1], "token_type_ids": [0], "label": 0},
    ])
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 7, 7]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 1], [0, 0, 0]]
    assert "label" not in batch and batch["labels"].tolist() == [1, 0]
    assert batch["labels"].dtype == torch.long


def test_padding_collator_left_multiple_and_label_sequences():
    collator = DataCollatorWithPadding(ToyTokenizer(pad_token_id=None, padding_side="left"), pad_to_multiple_of=4)
    batch = collator([
        {"input_ids": [1, 2], "attention_mask": [1, 1], "labels": [5, 6]},
        {"input_ids": [3, 4, 5], "attention_mask": [1, 1, 1], "labels": [7, 8, 9]},
    ])
    assert batch["input_ids"].tolist() == [[0, 0, 1, 2], [0, 3, 4, 5]]
    assert batch["attention_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert batch["labels"].tolist() == [[-100, -100, 5, 6], [-100, 7, 8, 9]]


def test_padding_collator_max_length_and_uses_tokenizer_pad():
    batch = DataCollatorWithPadding(None, padding="max_length", max_length=5)([{"input_ids": [1]}, {"input_ids": [2, 3]}])
    assert batch["input_ids"].tolist() == [[1, 0, 0, 0, 0], [2, 3, 0, 0, 0]]
    with pytest.raises(ValueError, match="max_length"):
        DataCollatorWithPadding(None, padding="max_length")([{"input_ids": [1]}])
    with pytest.raises(ValueError, match="padding=True"):
        DataCollatorWithPadding(None, padding=False)([{"input_ids": [1]}, {"input_ids": [2, 3]}])

    calls = {}

    class PadTokenizer:
        def pad(self, features, **kwargs):
            calls.update(kwargs)
            return {"input_ids": torch.zeros(len(features), 2), "label": torch.tensor([1, 2])}

    out = DataCollatorWithPadding(PadTokenizer(), pad_to_multiple_of=8)([{"input_ids": [1]}, {"input_ids": [2]}])
    assert calls == {"padding": True, "max_length": None, "pad_to_multiple_of": 8, "return_tensors": "pt"}
    assert out["labels"].tolist() == [1, 2] and "label" not in out


def test_seq2seq_pads_labels_and_builds_decoder_inputs():
    class Model:
        def prepare_decoder_input_ids_from_labels(self, labels):
            shifted = torch.zeros_like(labels)
            shifted[:, 1:] = labels[:, :-1].clamp(min=0)
            return shifted

    collator = DataCollatorForSeq2Seq(ToyTokenizer(pad_token_id=1), model=Model(), pad_to_multiple_of=4)
    batch = collator([
        {"input_ids": [5, 6, 7], "labels": [8, 9]},
        {"input_ids": [5], "labels": [10, 11, 12]},
    ])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 1], [5, 1, 1, 1]]
    assert batch["labels"].tolist() == [[8, 9, -100, -100], [10, 11, 12, -100]]
    assert batch["labels"].dtype == torch.long
    assert batch["decoder_input_ids"].tolist() == [[0, 8, 9, 0], [0, 10, 11, 12]]
    custom = DataCollatorForSeq2Seq(None, label_pad_token_id=-1)([{"input_ids": [1], "label": [2]},
                                                                  {"input_ids": [1], "label": [2, 3]}])
    assert custom["labels"].tolist() == [[2, -1], [2, 3]] and "decoder_input_ids" not in custom


def test_token_classification_labels_follow_inputs():
    batch = DataCollatorForTokenClassification(ToyTokenizer())([
        {"input_ids": [1, 2, 3], "labels": [0, 1, 2]},
        {"input_ids": [4], "labels": [1]},
    ])
    assert batch["labels"].tolist() == [[0, 1, 2], [1, -100, -100]]


def test_causal_lm_labels_mask_padding():
    collator = DataCollatorForLanguageModeling(ToyTokenizer(pad_token_id=0), mlm=False)
    batch = collator([{"input_ids": [3, 4, 5]}, {"input_ids": [6]}])
    assert batch["input_ids"].tolist() == [[3, 4, 5], [6, 0, 0]]
    assert batch["labels"].tolist() == [[3, 4, 5], [6, -100, -100]]
    bare = collator([[1, 2], [3]])
    assert bare["labels"].tolist() == [[1, 2], [3, -100]]


def test_mlm_masking_is_seeded_and_consistent():
    tok = ToyTokenizer(pad_token_id=0, mask_token_id=1, vocab=30)
    collator = DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.5)
    examples = [{"input_ids": list(range(2, 30))}, {"input_ids": list(range(2, 20))}]
    torch.manual_seed(0)
    first = collator(examples)
    torch.manual_seed(0)
    second = collator(examples)
    assert torch.equal(first["input_ids"], second["input_ids"]) and torch.equal(first["labels"], second["labels"])
    original = pad_sequences([e["input_ids"] for e in examples], 0)
    chosen = first["labels"] != -100
    assert chosen.any() and torch.equal(first["labels"][chosen], original[chosen])
    assert not chosen[original == 0].any()  # padding is never chosen
    assert torch.equal(first["input_ids"][~chosen], original[~chosen])
    assert (first["input_ids"][chosen] == 1).float().mean() > 0.5  # mostly the mask token
    with pytest.raises(ValueError, match="mask token"):
        DataCollatorForLanguageModeling(ToyTokenizer(), mlm=True)


def test_non_mapping_examples_are_rejected_with_a_hint():
    with pytest.raises(TypeError, match="__getitem__"):
        default_data_collator([(1, 2), (3, 4)])
