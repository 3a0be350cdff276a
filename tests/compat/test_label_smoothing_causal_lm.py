"""Label smoothing on causal LMs: the smoothed loss compares the logits at position t with label t + 1, as
transformers.Trainer does for the models of its causal-LM mapping; other models are smoothed unshifted."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import trainwell
from trainwell.utils.model_utils import is_causal_lm

transformers = pytest.importorskip("transformers")


class _Texts(torch.utils.data.Dataset):
    """8 rows of 9 tokens; row i has its first i % 4 labels masked (-100), so rows differ in labelled tokens; with
    ``second_masked`` every row has only its second label masked (8 labels, 7 of them after the shift)."""

    def __init__(self, second_masked: bool = False) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = [torch.randint(5, 60, (9,), generator=g) for _ in range(8)]
        self.second_masked = second_masked

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        labels = self.ids[i].clone()
        if self.second_masked:
            labels[1] = -100
        else:
            labels[: i % 4] = -100
        return {"input_ids": self.ids[i], "labels": labels}


def _llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16))


def _gpt2():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0))


def _logged_losses(lib, model, tmp_path, accumulation: int = 1, data: Any = None) -> list[float]:
    args = lib.TrainingArguments(
        output_dir=str(tmp_path / lib.__name__), per_device_train_batch_size=4 // accumulation,
        gradient_accumulation_steps=accumulation, max_steps=4, logging_steps=1, label_smoothing_factor=0.1,
        learning_rate=1e-2, optim="adamw_torch", seed=3, report_to="none", save_strategy="no", disable_tqdm=True,
        use_cpu=True)
    trainer = lib.Trainer(model=copy.deepcopy(model), args=args, train_dataset=data or _Texts())
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.slow  # over a second
@pytest.mark.parametrize("accumulation", [1, 2])
def test_llama_smoothed_loss_equals_upstreams(tmp_path, accumulation):
    """A tiny Llama with label_smoothing_factor=0.1: every logged loss of 4 steps equals transformers.Trainer's
    (batches of 4, or 2 micro-batches of 2 per step, which both libraries make the same big-batch update)."""
    model = _llama()
    ours = _logged_losses(trainwell, model, tmp_path, accumulation)
    assert ours == pytest.approx(_logged_losses(transformers, model, tmp_path, accumulation), rel=1e-5)
    assert ours == pytest.approx(_logged_losses(trainwell, model, tmp_path, 1), rel=1e-5)


@pytest.mark.slow  # over a second
def test_gpt2_smoothed_loss_is_the_shifted_mean(tmp_path):
    """A tiny GPT-2: trainwell's smoothed loss is the mean over the shifted labels (torch's cross entropy with
    label_smoothing=0.1 of logits[:, :-1] against labels[:, 1:]: 29 of the first 4 rows' 30 labels). transformers
    5.x smooths the same shifted tokens but divides their sum by the unshifted labels it counts for GPT-2
    (num_items_in_batch): with every row's second label masked (8 labels, 7 after the shift) its first logged loss
    is 7/8 of trainwell's, the true mean (3.6423 for 4.1626)."""
    model = _gpt2()
    data = _Texts()
    batch = {key: torch.stack([data[i][key] for i in range(4)]) for key in ("input_ids", "labels")}
    trainer = trainwell.Trainer(model=copy.deepcopy(model), args=trainwell.TrainingArguments(
        output_dir=str(tmp_path / "direct"), label_smoothing_factor=0.1, report_to="none"))
    trainer.model.eval()
    with torch.no_grad():
        ours = trainer.compute_loss(trainer.model, dict(batch))
        logits = trainer.model(input_ids=batch["input_ids"]).logits
    expected = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), label_smoothing=0.1)
    assert float(ours) == pytest.approx(float(expected), rel=1e-5)
    assert (int((batch["labels"][:, 1:] != -100).sum()), int((batch["labels"] != -100).sum())) == (29, 30)
    uniform = _Texts(second_masked=True)
    first_ours = _logged_losses(trainwell, model, tmp_path, data=uniform)[0]
    first_upstream = _logged_losses(transformers, model, tmp_path, data=uniform)[0]
    assert first_upstream == pytest.approx(first_ours * 7 / 8, rel=1e-5)


def test_which_models_are_causal_lms():
    """Upstream's rule, by class name: GPT-2 and Llama heads are causal LMs; a masked LM, T5 and a plain module
    are not (their labels line up with their logits)."""
    bert = transformers.BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=16)
    t5 = transformers.T5Config(vocab_size=32, d_model=8, d_ff=16, d_kv=4, num_layers=1, num_heads=2)
    assert is_causal_lm(_gpt2()) and is_causal_lm(_llama())
    assert not is_causal_lm(transformers.BertForMaskedLM(bert))
    assert not is_causal_lm(transformers.T5ForConditionalGeneration(t5))
    assert not is_causal_lm(nn.Linear(2, 2))
