"""Gradient accumulation with the models users train: six ``transformers`` classes built tiny from a config.

The ground truth: ``gradient_accumulation_steps`` 1 and 4 over micro-batches of 2 rows with uneven labelled-token
counts (3 and 16 per micro-batch; 1 and 14 after a causal LM's shift), plain SGD, no clipping, one optimizer step of
8 examples, updates the weights exactly like one big batch of the same 8 examples under the model's own loss, and
logs that batch's loss. Two ranks (``torchrun``, gloo) do too, with ``average_tokens_across_devices``.

Upstream (the installed ``transformers.Trainer``) runs the same body: it is a big batch only for the Llama causal
LM; for GPT-2 it counts the unshifted labels (the update is the big batch's times shifted/unshifted = 30/38), and
for the four heads whose loss ignores ``num_items_in_batch`` it stops dividing by the micro-batches as soon as the
forward takes ``**kwargs``: its update is the sum of the micro-batch means. The test asserts those numbers too.

The file is also the 2-rank job (torchrun runs it as a script).
"""

from __future__ import annotations

import copy
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch.utils.data import SequentialSampler

pytestmark = pytest.mark.slow  # transformers models on both libraries: over a second a test

transformers = pytest.importorskip("transformers")

T = 12  # tokens per row
COUNTS = [2, 1, 8, 8, 1, 2, 8, 8]  # labelled tokens per row: micro-batches of 2 rows hold 3, 16, 3, 16
LR = 1.0
TIMEOUT_S = 300


def _bert(**extra: Any) -> Any:
    return transformers.BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0, **extra)


MODELS: dict[str, tuple[str, Callable[[], Any]]] = {  # name: (label kind, builder)
    "GPT2LMHeadModel": ("causal", lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50, n_positions=32, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0))),
    "LlamaForCausalLM": ("causal", lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32))),
    "BertForMaskedLM": ("masked", lambda: transformers.BertForMaskedLM(_bert())),
    "BertForTokenClassification": ("token", lambda: transformers.BertForTokenClassification(_bert(num_labels=3))),
    "T5ForConditionalGeneration": ("masked", lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=50, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, dropout_rate=0.0,
        decoder_start_token_id=0, pad_token_id=0))),
    "BertForSequenceClassification": ("sequence",
                                      lambda: transformers.BertForSequenceClassification(_bert(num_labels=3))),
}


def build(name: str) -> Any:
    """The tiny model ``name``, the same weights every time."""
    torch.manual_seed(0)
    return MODELS[name][1]()


def rows_for(name: str) -> list[dict[str, torch.Tensor]]:
    """8 examples of ``T`` tokens; row i has ``COUNTS[i]`` labelled tokens, at the start (so the shift drops one)."""
    kind = MODELS[name][0]
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, k in enumerate(COUNTS):
        ids = torch.randint(1, 50, (T,), generator=g)
        labels = torch.full((T,), -100)
        if kind == "causal":
            labels[:k] = ids[:k]
        elif kind == "token":
            labels[:k] = torch.randint(0, 3, (k,), generator=g)
        elif kind == "sequence":
            labels = torch.tensor(i % 3)
        else:
            labels[:k] = torch.randint(1, 50, (k,), generator=g)
        rows.append({"input_ids": ids, "attention_mask": torch.ones(T, dtype=torch.long), "labels": labels})
    return rows


def _stack(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([r[key] for r in rows]) for key in rows[0]}


def _options(ga: int, per_device: int, **extra: Any) -> dict[str, Any]:
    return {**dict(per_device_train_batch_size=per_device, gradient_accumulation_steps=ga, max_steps=1, optim="sgd",
                   learning_rate=LR, lr_scheduler_type="constant", max_grad_norm=0.0, weight_decay=0.0,
                   logging_steps=1, save_strategy="no", report_to="none", seed=0, disable_tqdm=True, use_cpu=True),
            **extra}


def train(lib: Any, model: Any, rows: list[dict[str, torch.Tensor]], ga: int, out: Path, *, in_order: bool = True,
          per_device: int | None = None, **extra: Any) -> tuple[Any, float]:
    """One optimizer step of ``lib.Trainer`` (trainwell or transformers); returns the model and the logged loss."""
    cls = lib.Trainer
    if in_order:
        class InOrder(cls):  # type: ignore[misc, valid-type]
            def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
                return SequentialSampler(self.train_dataset)

        cls = InOrder
    args = lib.TrainingArguments(output_dir=str(out), **_options(ga, per_device or 8 // ga, **extra))
    trainer = cls(model=model, args=args, train_dataset=rows)
    trainer.train()
    return trainer.model, [e["loss"] for e in trainer.state.log_history if "loss" in e][0]


def update(model: Any, start: Any) -> torch.Tensor:
    """Every weight's change, flattened (with SGD and lr 1: minus the gradient)."""
    return torch.cat([(p.detach() - q.detach()).flatten() for p, q in zip(model.parameters(), start.parameters())])


def big_batch(name: str, start: Any, micro_batches: int = 1) -> tuple[torch.Tensor, float]:
    """The update and loss of the 8 examples as ``micro_batches`` equal batches, each its own mean, summed: with one
    batch the ground truth; with 4, what a trainer that adds the micro-batch means without dividing does."""
    model = copy.deepcopy(start).train()
    rows = rows_for(name)
    size, total = len(rows) // micro_batches, 0.0
    for i in range(micro_batches):
        loss = model(**_stack(rows[i * size:(i + 1) * size])).loss
        loss.backward()
        total += loss.item()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= LR * p.grad
    return update(model, start), total


def _same_update(ours: torch.Tensor, truth: torch.Tensor) -> None:
    torch.testing.assert_close(ours, truth, rtol=1e-4, atol=1e-6)


@pytest.fixture(autouse=True)
def _quiet_transformers():
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    yield
    transformers.logging.set_verbosity(verbosity)


@pytest.mark.parametrize("ga", [1, 4])
@pytest.mark.parametrize("name", list(MODELS))
def test_accumulated_step_is_one_big_batch(tmp_path, name, ga):
    import trainwell

    start = build(name)
    truth, truth_loss = big_batch(name, start)
    model, logged = train(trainwell, copy.deepcopy(start), rows_for(name), ga, tmp_path)
    _same_update(update(model, start), truth)
    assert logged == pytest.approx(truth_loss, rel=1e-5)


@pytest.mark.parametrize("name", list(MODELS))
def test_upstream_numbers_with_four_micro_batches(tmp_path, name):
    """What the installed transformers.Trainer does with the same body (the README's differences table)."""
    start = build(name)
    truth, truth_loss = big_batch(name, start)
    model, logged = train(transformers, copy.deepcopy(start), rows_for(name), 4, tmp_path)
    theirs = update(model, start)
    if name == "LlamaForCausalLM":  # a big batch
        _same_update(theirs, truth)
        assert logged == pytest.approx(truth_loss, rel=1e-5)
    elif name == "GPT2LMHeadModel":  # the right direction, divided by the unshifted labels (38) instead of 30
        _same_update(theirs, truth * 30 / 38)
        assert logged == pytest.approx(truth_loss * 30 / 38, rel=1e-5)
    else:  # the loss ignores num_items_in_batch and is not divided: the sum of the 4 micro-batch means
        summed, summed_loss = big_batch(name, start, micro_batches=4)
        _same_update(theirs, summed)
        assert logged == pytest.approx(summed_loss, rel=1e-5)
        if name != "BertForSequenceClassification":  # a mean of means points elsewhere than the big batch
            cosine = torch.nn.functional.cosine_similarity(theirs, truth, dim=0).item()
            assert cosine < 0.95


def test_probe_reads_what_each_loss_averages_over_and_changes_nothing():
    from trainwell.loops.loss_scaling import probe_loss_rule

    expected = {"GPT2LMHeadModel": (True, "shifted"), "LlamaForCausalLM": (True, "shifted"),
                "BertForMaskedLM": (False, "labels"), "BertForTokenClassification": (False, "labels"),
                "T5ForConditionalGeneration": (False, "labels"), "BertForSequenceClassification": (False, "labels")}
    for name, (takes, count) in expected.items():
        model = build(name).train()
        weights = {k: v.clone() for k, v in model.state_dict().items()}
        rng = torch.get_rng_state()
        rule = probe_loss_rule(model, _stack(rows_for(name)[2:4]))
        assert (rule.takes_num_items, rule.count) == (takes, count), (name, rule)
        assert torch.equal(torch.get_rng_state(), rng), name  # the random stream is where it was
        assert all(m.training for m in model.modules()), name  # train mode put back
        assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items()), name


def test_a_declared_mean_causal_lm_is_weighted_by_its_shifted_labels(tmp_path):
    """``accepts_loss_kwargs = False`` (upstream's declaration) is believed: num_items_in_batch is not passed, and
    the probe still finds that the mean is over the shifted labels, so the step is the big batch's."""
    import trainwell
    from trainwell.loops.loss_scaling import probe_loss_rule

    start = build("GPT2LMHeadModel")
    truth, truth_loss = big_batch("GPT2LMHeadModel", start)
    model = copy.deepcopy(start)
    model.accepts_loss_kwargs = False
    rule = probe_loss_rule(model, _stack(rows_for("GPT2LMHeadModel")[:4]))  # halves of 3 and 16 labels (1 and 14)
    assert (rule.takes_num_items, rule.count, rule.how) == (False, "shifted", "probed: a mean over its own items")
    trained, logged = train(trainwell, model, rows_for("GPT2LMHeadModel"), 4, tmp_path)
    _same_update(update(trained, start), truth)
    assert logged == pytest.approx(truth_loss, rel=1e-5)


def test_probe_tells_a_row_mean_from_a_token_mean():
    from torch import nn
    from torch.nn import functional as F

    from trainwell.loops.loss_scaling import probe_loss_rule

    class RowMean(nn.Module):  # a regression over rows whose labels hold -100 padding (a token count would be wrong)
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.linear = nn.Linear(4, 1)
            self.drop = nn.Dropout(0.5)

        def forward(self, input_ids, labels=None, **kwargs):
            pred = self.linear(self.drop(input_ids.float())).squeeze(-1)
            return {"loss": F.mse_loss(pred, labels.float().mean(-1)), "logits": pred}

    labels = torch.tensor([[1, -100, -100, -100], [1, 2, 3, 4]])
    model = RowMean()
    rng = torch.get_rng_state()
    rule = probe_loss_rule(model, {"input_ids": torch.arange(8).view(2, 4), "labels": labels})
    assert (rule.takes_num_items, rule.count) == (False, "rows")
    assert torch.equal(torch.get_rng_state(), rng)


def test_the_decision_is_logged_once(tmp_path, caplog):
    import trainwell

    start = build("GPT2LMHeadModel")
    with caplog.at_level(logging.INFO, logger="trainwell"):
        train(trainwell, copy.deepcopy(start), rows_for("GPT2LMHeadModel") * 2, 4, tmp_path, max_steps=2)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Gradient accumulation with")]
    assert len(lines) == 1 and "GPT2LMHeadModel: its loss is divided by num_items_in_batch" in lines[0]
    assert "shifted labels (labels[..., 1:] != -100) (probed" in lines[0]


# ------------------------------------------------------------------------------------------------ two ranks
def job(out: Path) -> None:
    """Each model, one optimizer step over 2 ranks x 2 micro-batches x 2 rows; rank 0 writes the updates."""
    import trainwell

    transformers.logging.set_verbosity_error()
    results = {}
    for name in MODELS:
        start = build(name)
        model, logged = train(trainwell, copy.deepcopy(start), rows_for(name), 2, out / name, in_order=False,
                              per_device=2, average_tokens_across_devices=True)
        results[name] = {"update": update(model, start).tolist(), "loss": logged}
    if int(os.environ.get("RANK", "0")) == 0:
        (out / "results.json").write_text(json.dumps(results))


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_accumulated_step_is_one_big_batch(tmp_path):
    from helpers.launch import start, torchrun, wait

    proc = start(torchrun(Path(__file__).resolve(), tmp_path))
    wait(proc, "the 2-rank accumulation job", timeout=TIMEOUT_S)
    results = json.loads((tmp_path / "results.json").read_text())
    for name in MODELS:
        truth, truth_loss = big_batch(name, build(name))
        _same_update(torch.tensor(results[name]["update"]), truth)
        assert results[name]["loss"] == pytest.approx(truth_loss, rel=1e-5), name


if __name__ == "__main__":
    job(Path(sys.argv[1]))
