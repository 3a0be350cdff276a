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


# ---- against transformers.Seq2SeqTrainer, with a tiny T5 built from its config ------------------------------------

def _tiny_t5():
    transformers = pytest.importorskip("transformers")
    config = transformers.T5Config(vocab_size=40, d_model=16, d_ff=32, d_kv=8, num_layers=1, num_heads=2,
                                   dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    return transformers, transformers.T5ForConditionalGeneration(config)


class _Seq2SeqData(torch.utils.data.Dataset):
    """7 examples (batches of 4 leave a short last batch of 3), inputs of 3 to 9 tokens, targets of 2 to 5."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.rows = [(torch.randint(2, 40, (3 + i,), generator=g), torch.randint(2, 40, (2 + i % 4,), generator=g))
                     for i in range(7)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i][0], "labels": self.rows[i][1]}


def _collate_for(model):
    """Right-pads inputs (0) and labels (-100) and adds the decoder inputs made from the labels, as
    ``DataCollatorForSeq2Seq(model=...)`` does."""
    def collate(rows):
        pad = nn.utils.rnn.pad_sequence
        ids = pad([r["input_ids"] for r in rows], batch_first=True, padding_value=0)
        labels = pad([r["labels"] for r in rows], batch_first=True, padding_value=-100)
        return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels,
                "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels=labels)}
    return collate


def _both_trainers(tmp_path, model, **kw):
    """transformers.Seq2SeqTrainer and trainwell's on copies of ``model`` (upstream writes into the model's
    generation config during evaluation, so each library gets its own copy)."""
    import copy

    transformers = pytest.importorskip("transformers")
    data = _Seq2SeqData()
    base = dict(per_device_eval_batch_size=4, predict_with_generate=True, report_to="none", disable_tqdm=True, **kw)
    out = {}
    for name, lib in (("upstream", transformers), ("trainwell", __import__("trainwell"))):
        copied = copy.deepcopy(model)
        out[name] = lib.Seq2SeqTrainer(model=copied, args=lib.Seq2SeqTrainingArguments(
            output_dir=str(tmp_path / name), **base), data_collator=_collate_for(copied))
    return out, data


def test_generated_ids_and_labels_equal_upstreams(tmp_path):
    """With beams and a generation length from the arguments, or ``max_length`` passed to ``predict``, trainwell's
    predictions and labels equal transformers.Seq2SeqTrainer's, padding included (to the model's generation-config
    length, 20, with the pad id), and so does the loss of ``predict``'s full batches."""
    _, model = _tiny_t5()
    trainers, data = _both_trainers(tmp_path, model, generation_max_length=7, generation_num_beams=2)
    for kwargs in ({}, {"max_length": 4, "num_beams": 1}):
        up, ours = (trainers[n].predict(data, **kwargs) for n in ("upstream", "trainwell"))
        assert ours.predictions.shape == up.predictions.shape == (7, 20)
        np.testing.assert_array_equal(ours.predictions, up.predictions)
        np.testing.assert_array_equal(ours.label_ids, up.label_ids)
    generated = model.generate(input_ids=data[0]["input_ids"][None], max_length=4)
    np.testing.assert_array_equal(ours.predictions[0, :generated.shape[1]], generated[0].numpy())


def test_eval_loss_is_the_mean_over_samples(tmp_path):
    """eval_loss with ``predict_with_generate`` is the mean over the 7 samples of their batch's loss (batches of 4
    and 3), as transformers.Trainer reports for the same model and data. transformers.Seq2SeqTrainer gathers
    without dropping the short last batch's repeats: its eval_loss counts that batch's loss 4 times for its 3
    samples (the plain mean of the two batch losses)."""
    transformers, model = _tiny_t5()
    trainers, data = _both_trainers(tmp_path, model, generation_max_length=5)
    collate = _collate_for(model)
    model.eval()
    with torch.no_grad():
        batch_means = [float(model(**collate([data[i] for i in range(s, min(s + 4, 7))])).loss) for s in (0, 4)]
    truth = (4 * batch_means[0] + 3 * batch_means[1]) / 7
    plain = transformers.Trainer(model=model, args=transformers.TrainingArguments(
        output_dir=str(tmp_path / "plain"), per_device_eval_batch_size=4, report_to="none"),
        data_collator=collate, eval_dataset=data)
    assert plain.evaluate()["eval_loss"] == pytest.approx(truth, rel=1e-5)
    assert trainers["trainwell"].evaluate(data)["eval_loss"] == pytest.approx(truth, rel=1e-5)
    upstream = trainers["upstream"].evaluate(data)["eval_loss"]
    assert upstream == pytest.approx(sum(batch_means) / 2, rel=1e-5) != pytest.approx(truth, rel=1e-3)


def test_default_generation_length_is_the_models_on_every_batch(tmp_path):
    """Without a max_length anywhere, every batch generates what ``model.generate`` gives (20 new tokens after the
    start token). transformers 5.x writes the defaults into the model's generation config after its first batch,
    and the later batches then stop one token earlier (20 tokens in all)."""
    _, model = _tiny_t5()
    trainers, data = _both_trainers(tmp_path, model)
    ours = trainers["trainwell"].predict(data).predictions
    assert ours.shape == (7, 21)
    for i in range(7):
        expected = model.generate(input_ids=data[i]["input_ids"][None])[0].numpy()
        np.testing.assert_array_equal(ours[i, :len(expected)], expected)
    up = trainers["upstream"].predict(data).predictions
    assert (up[:4] != -100).sum(axis=1).tolist() == [21] * 4 and (up[4:] != -100).sum(axis=1).tolist() == [20] * 3


def test_decoder_prompt_of_another_shape_is_kept_for_generation():
    """``decoder_input_ids`` made from the labels (same shape) are left out of generation with their mask; decoder
    ids of another shape are a prompt that generation continues, as upstream."""
    from trainwell.trainer.seq2seq import _generation_inputs

    labels, ids = torch.ones(2, 5, dtype=torch.long), torch.ones(2, 3, dtype=torch.long)
    made = _generation_inputs({"input_ids": ids, "labels": labels, "decoder_input_ids": labels,
                               "decoder_attention_mask": labels})
    assert set(made) == {"input_ids"}
    prompt = _generation_inputs({"input_ids": ids, "labels": labels, "decoder_input_ids": ids[:, :2]})
    assert set(prompt) == {"input_ids", "decoder_input_ids"}


def test_generation_is_synced_across_ranks_only_with_sharded_parameters(tmp_path, monkeypatch):
    """``synced_gpus`` (every rank steps until the longest generation ends) is asked for on several ranks with FSDP
    or ZeRO-3, whose forward passes gather parameters from every rank; not on one rank or with DDP."""
    trainer = Seq2SeqTrainer(model=CopyModel(), args=_args(tmp_path))
    assert not trainer._generation_needs_synced_gpus()
    monkeypatch.setattr(type(trainer.args), "world_size", property(lambda self: 2))
    assert not trainer._generation_needs_synced_gpus()
    monkeypatch.setattr(trainer.args, "fsdp", ["full_shard"])
    assert trainer._generation_needs_synced_gpus()
