"""A mixture-of-experts model's router loss under ``average_tokens_across_devices`` (the default), in one process:
``compute_loss`` on one rank's half of a batch, told the world is 2 ranks, gives the full batch's loss and gradients
(as the ranks' average), the router term counted once; transformers 5.24 counts it ``world_size`` times
(transformers#48690). The 2-rank run itself: ``tests/distributed/test_moe_aux_loss_ranks.py``.

The shape of upstream's later test (huggingface/transformers ``tests/trainer/test_trainer_moe_loss.py`` at 4cc94ae2:
rows repeated so that each half routes like the whole), on a tiny ``MixtralForCausalLM``.
"""

from __future__ import annotations

import pytest
import torch

import trainwell

transformers = pytest.importorskip("transformers")

COEF = 0.5


def _model(coef: float = COEF):
    torch.manual_seed(17)
    config = transformers.MixtralConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, num_local_experts=4,
                                        num_experts_per_tok=2, router_aux_loss_coef=coef, output_router_logits=True,
                                        max_position_embeddings=16, use_cache=False)
    return transformers.MixtralForCausalLM(config)


def _batch() -> dict[str, torch.Tensor]:
    rows = [(torch.arange(9) * (3 + i) + 7 * i) % 29 + 3 for i in range(2)]
    input_ids = torch.stack(rows).repeat_interleave(2, dim=0)  # rows 0,1 and 2,3 equal: each rank routes alike
    labels = input_ids.clone()
    labels[0, :3] = -100  # uneven target tokens: rank 0 (rows 0 and 2) holds 14 of the 24 shifted labels, rank 1 10
    labels[1, :7] = -100
    return {"input_ids": input_ids, "labels": labels, "attention_mask": torch.ones_like(input_ids)}


def _loss_and_grads(lib, trainer, monkeypatch, world: int, num_items: int):
    """The loss and gradients of ``world`` ranks, averaged as DDP averages them: rank r holds rows ``r::world``."""
    trainer.model.zero_grad(set_to_none=True)
    losses = []
    with monkeypatch.context() as m:
        if lib is trainwell:
            m.setattr(type(trainer.args), "world_size", property(lambda self: world))
        else:
            m.setattr(trainer.accelerator.state, "num_processes", world)
        for rank in range(world):
            inputs = {k: v[rank::world] for k, v in _batch().items()}
            loss = trainer.compute_loss(trainer.model, inputs, num_items_in_batch=num_items) / world
            loss.backward()
            losses.append(loss.detach())
    return sum(losses), {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters()
                         if p.grad is not None}


def _measure(lib, tmp_path, monkeypatch, coef: float = COEF):
    args = lib.TrainingArguments(str(tmp_path / lib.__name__), use_cpu=True, report_to="none")
    assert args.average_tokens_across_devices is True  # both defaults
    trainer = lib.Trainer(model=_model(coef), args=args)
    labels = _batch()["labels"]
    num_items = int(labels[..., 1:].ne(-100).sum())  # the shifted labels of the whole batch
    full = _loss_and_grads(lib, trainer, monkeypatch, 1, num_items)
    half = _loss_and_grads(lib, trainer, monkeypatch, 2, num_items)
    with torch.no_grad():
        aux = trainer.model(**_batch()).aux_loss
    return full, half, float(trainer.model.router_aux_loss_coef * aux)


@pytest.mark.slow  # builds a Mixtral on both libraries (about 2 s with transformers' first import)
def test_the_router_loss_counts_once_per_rank(tmp_path, monkeypatch):
    (full_loss, full_grads), (half_loss, half_grads), aux_term = _measure(trainwell, tmp_path, monkeypatch)
    torch.testing.assert_close(half_loss, full_loss)
    assert half_grads.keys() == full_grads.keys()
    for name, grad in full_grads.items():
        torch.testing.assert_close(half_grads[name], grad, atol=1e-6, rtol=1e-4, msg=name)

    # transformers 5.24: the router term multiplied by the world size too (the ranks' average: 2 x coef x aux)
    (up_full, up_full_grads), (up_half, up_half_grads), up_aux = _measure(transformers, tmp_path, monkeypatch)
    torch.testing.assert_close(up_full, full_loss)
    torch.testing.assert_close(up_half, up_full + up_aux, rtol=1e-5, atol=1e-6)
    router = next(name for name in up_full_grads if "gate" in name and "experts" not in name)
    assert not torch.allclose(up_half_grads[router], up_full_grads[router], rtol=1e-3)


@pytest.mark.slow
def test_without_a_router_coefficient_nothing_is_taken_out(tmp_path, monkeypatch):
    (full_loss, _), (half_loss, _), aux_term = _measure(trainwell, tmp_path, monkeypatch, coef=0.0)
    assert aux_term == 0.0
    torch.testing.assert_close(half_loss, full_loss)
