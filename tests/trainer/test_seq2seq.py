"""Seq2SeqTrainer: generation during evaluation/prediction, padding of generated ids, generation defaults."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from trainwell import Seq2SeqTrainer, Seq2SeqTrainingArguments


class CopyModel(nn.Module):
    """Learns to copy its input tokens; ``generate`` emits argmax tokens for each input position (up to max_length)."""

    def __init__(self, vocab: int = 7) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.out = nn.Linear(16, vocab)

    def forward(self, input_ids, labels=None):
        logits = self.out(self.emb(input_ids))
        loss = None if labels is None else nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}

    def generate(self, input_ids, max_length=None, num_beams=1):
        tokens = self.out(self.emb(input_ids)).argmax(-1)
        return tokens[:, :max_length] if max_length is not None else tokens


class CopyData(torch.utils.data.Dataset):
    def __init__(self, n: int = 24, length: int = 5) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(1, 7, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(tmp_path, **kw) -> Seq2SeqTrainingArguments:
    base = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                learning_rate=0.1, num_train_epochs=8, report_to="none", disable_tqdm=True, save_strategy="no",
                predict_with_generate=True)
    base.update(kw)
    return Seq2SeqTrainingArguments(**base)


def test_predict_with_generate_returns_generated_ids_padded_to_max_length(tmp_path):
    model, data = CopyModel(), CopyData()
    seen = {}

    def metrics(pred):
        seen["shapes"] = (pred.predictions.shape, pred.label_ids.shape)
        n = min(pred.predictions.shape[1], 5)
        return {"exact": float((pred.predictions[:, :n] == pred.label_ids[:, :n]).mean())}

    trainer = Seq2SeqTrainer(model=model, args=_args(tmp_path, generation_max_length=8), train_dataset=data,
                             eval_dataset=data, compute_metrics=metrics)
    trainer.train()
    result = trainer.evaluate()
    assert seen["shapes"] == ((24, 8), (24, 8))
    assert result["eval_exact"] > 0.9
    out = trainer.predict(data, max_length=3)
    expected = model.generate(data.ids)[:, :3].numpy()
    np.testing.assert_array_equal(out.predictions, expected)
    assert "test_loss" in out.metrics


def test_without_predict_with_generate_returns_logits(tmp_path):
    trainer = Seq2SeqTrainer(model=CopyModel(), args=_args(tmp_path, predict_with_generate=False))
    out = trainer.predict(CopyData(8))
    assert out.predictions.shape == (8, 5, 7)


def test_model_without_generate_is_a_clear_error(tmp_path):
    model = nn.Sequential()
    trainer = Seq2SeqTrainer(model=CopyModel(), args=_args(tmp_path))
    trainer.model = model
    with pytest.raises(TypeError, match="generate"):
        trainer.prediction_step(model, {"input_ids": torch.ones(2, 3, dtype=torch.long)}, False)
