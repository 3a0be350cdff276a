"""The padding-free and multiple-choice collators, ``LabelSmoother``, ``LengthGroupedSampler`` and the prepared
dataloaders' attributes against upstream's on the same inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import trainwell

transformers = pytest.importorskip("transformers")
from transformers import data as upstream_data  # noqa: E402
from transformers import trainer_pt_utils  # noqa: E402


def _tokenizer(padding_side: str = "right"):
    from tokenizers import Tokenizer, models

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i for i in range(2, 40)}}
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="[UNK]")),
                                                pad_token="[PAD]", unk_token="[UNK]")
    fast.padding_side = padding_side
    return fast


def _same(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    for key in theirs:
        if isinstance(theirs[key], (torch.Tensor, np.ndarray)):
            assert type(ours[key]) is type(theirs[key]), key
            assert ours[key].dtype == theirs[key].dtype, key
            np.testing.assert_array_equal(np.asarray(ours[key]), np.asarray(theirs[key]), err_msg=key)
        else:
            assert ours[key] == theirs[key], key


# --------------------------------------------------------------------------------- DataCollatorWithFlattening
FEATURES = [{"input_ids": [5, 6, 7, 8]}, {"input_ids": []}, {"input_ids": [9, 10]}, {"input_ids": [11, 12, 13]}]
LABELLED = [{"input_ids": torch.tensor([5, 6, 7]), "labels": torch.tensor([-100, 6, 7])},
            {"input_ids": torch.tensor([8, 9]), "labels": torch.tensor([8, 9])}]
OPTIONS = [dict(), dict(return_position_ids=False), dict(separator_id=-1), dict(return_flash_attn_kwargs=True),
           dict(return_seq_idx=True), dict(position_ids_start=2), dict(return_tensors="np"),
           dict(return_flash_attn_kwargs=True, return_seq_idx=True, return_tensors="np")]


@pytest.mark.parametrize("options", OPTIONS, ids=repr)
@pytest.mark.parametrize("features", [FEATURES, LABELLED], ids=["unlabelled", "labelled"])
def test_flattening_collator_equals_upstream(features, options):
    ours = trainwell.DataCollatorWithFlattening(**options)(features)
    theirs = upstream_data.DataCollatorWithFlattening(**options)(features)
    _same(ours, theirs)


def test_flattening_collator_restarts_positions_and_separates_labels():
    batch = trainwell.DataCollatorWithFlattening()(FEATURES)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 0, 1, 2]]
    assert batch["labels"].tolist() == [[-100, 6, 7, 8, -100, 10, -100, 12, 13]]
    call = trainwell.DataCollatorWithFlattening()(FEATURES, return_tensors="np", separator_id=-7)
    _same(call, upstream_data.DataCollatorWithFlattening()(FEATURES, return_tensors="np", separator_id=-7))


def test_flattening_collator_errors_as_upstream():
    for collator in (trainwell.DataCollatorWithFlattening(), upstream_data.DataCollatorWithFlattening()):
        with pytest.raises(ValueError, match="every example is empty"):
            collator([{"input_ids": []}])
    with pytest.raises(ValueError, match="return_tensors"):
        trainwell.DataCollatorWithFlattening(return_tensors="tf")(FEATURES)


# ------------------------------------------------------------------------------ DataCollatorForMultipleChoice
CHOICES = [{"input_ids": [[5, 6, 7], [8]], "attention_mask": [[1, 1, 1], [1]], "label": 1},
           {"input_ids": [[9], [10, 11]], "attention_mask": [[1], [1, 1]], "label": 0}]


@pytest.mark.parametrize("options", [dict(), dict(pad_to_multiple_of=4), dict(padding="max_length", max_length=5)],
                         ids=repr)
@pytest.mark.parametrize("side", ["right", "left"])
def test_multiple_choice_collator_equals_upstream(options, side):
    tokenizer = _tokenizer(side)
    ours = trainwell.DataCollatorForMultipleChoice(tokenizer, **options)(CHOICES)
    theirs = upstream_data.DataCollatorForMultipleChoice(tokenizer, **options)(CHOICES)
    _same(ours, theirs)
    assert ours["input_ids"].shape[:2] == (2, 2)


def test_multiple_choice_collator_without_a_transformers_tokenizer():
    """Trainwell's built-in padding (pad id 0, right side) gives upstream's batch for a tokenizer padding with 0."""
    relabelled = [{key: value for key, value in c.items() if key != "label"} | {"labels": c["label"]} for c in CHOICES]
    ours = trainwell.DataCollatorForMultipleChoice(None)(relabelled)
    theirs = upstream_data.DataCollatorForMultipleChoice(_tokenizer())(CHOICES)
    _same(ours, theirs)


# ------------------------------------------------------------------------------------------------ LabelSmoother
@pytest.mark.parametrize("shift", [False, True])
@pytest.mark.parametrize("num_items", [None, 5, torch.tensor(7)])
def test_label_smoother_equals_upstream(shift, num_items):
    torch.manual_seed(0)
    logits = torch.randn(2, 4, 6)
    labels = torch.tensor([[1, 2, -100, 3], [0, -100, -100, 5]])
    for output in ({"logits": logits}, (logits,)):
        ours = trainwell.LabelSmoother(epsilon=0.2)(output, labels, shift_labels=shift, num_items_in_batch=num_items)
        theirs = trainer_pt_utils.LabelSmoother(epsilon=0.2)(output, labels, shift_labels=shift,
                                                             num_items_in_batch=num_items)
        torch.testing.assert_close(ours, theirs)
    assert trainwell.LabelSmoother() == trainwell.LabelSmoother(epsilon=0.1, ignore_index=-100)  # a dataclass


# ---------------------------------------------------------------------------------------- LengthGroupedSampler
LENGTHS = [3, 9, 1, 7, 7, 2, 12, 5, 4, 8, 6, 10, 11, 2, 3, 1, 9]


def test_length_grouped_sampler_takes_upstreams_arguments():
    for kwargs in (dict(lengths=LENGTHS), dict(lengths=torch.tensor(LENGTHS)),
                   dict(dataset=[{"input_ids": [0] * n} for n in LENGTHS]),
                   dict(dataset=[{"ids": [0] * n} for n in LENGTHS], model_input_name="ids")):
        ours = trainwell.data.LengthGroupedSampler(4, generator=torch.Generator().manual_seed(5), **kwargs)
        theirs = trainer_pt_utils.LengthGroupedSampler(4, generator=torch.Generator().manual_seed(5), **kwargs)
        assert len(ours) == len(theirs) == len(LENGTHS)
        assert list(ours) == list(theirs) and list(ours) == list(theirs)  # the generator advances per epoch
        assert ours.lengths == theirs.lengths


def test_length_grouped_sampler_errors():
    with pytest.raises(ValueError, match="dataset= or lengths="):
        trainwell.data.LengthGroupedSampler(4)
    with pytest.raises(ValueError, match="'input_ids'"):
        trainwell.data.LengthGroupedSampler(4, dataset=[[1, 2], [3]])
    with pytest.raises(TypeError, match="batch size first"):
        trainwell.data.LengthGroupedSampler(LENGTHS, 4)


def test_length_grouped_sampler_without_a_generator_is_seeded_per_epoch():
    sampler = trainwell.data.LengthGroupedSampler(4, lengths=LENGTHS, seed=3)
    first = list(sampler)
    assert list(sampler) == first  # the same epoch: the same order
    sampler.set_epoch(1)
    assert sorted(sampler) == sorted(first) and list(sampler) != first


# --------------------------------------------------------------------------------------- prepared dataloaders
class _Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean()}


class _Sized(torch.utils.data.Dataset):
    total_length = 40  # accelerate's total_dataset_length prefers it

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((2,), float(i)), "labels": torch.tensor(float(i))}


@pytest.mark.parametrize("dataset", [[{"x": torch.ones(2), "labels": torch.tensor(1.0)}] * 7, _Sized()],
                         ids=["list", "total_length"])
def test_prepared_dataloaders_carry_accelerates_attributes(dataset, tmp_path):
    loaders = {}
    for lib in (trainwell, transformers):
        args = lib.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                     per_device_train_batch_size=3, per_device_eval_batch_size=2)
        trainer = lib.Trainer(model=_Regressor(), args=args, train_dataset=dataset, eval_dataset=dataset)
        loaders[lib.__name__] = (trainer.get_train_dataloader(), trainer.get_eval_dataloader(),
                                 trainer.get_test_dataloader(dataset))
    for ours, theirs in zip(loaders["trainwell"], loaders["transformers"]):
        assert ours.total_batch_size == theirs.total_batch_size
        assert ours.total_dataset_length == theirs.total_dataset_length
        assert ours.dataset is dataset and theirs.dataset is dataset
        assert len(ours) == len(theirs)  # (accelerate's loader keeps batch_size on its batch sampler only)
    assert [loader.total_batch_size for loader in loaders["trainwell"]] == [3, 2, 2]
