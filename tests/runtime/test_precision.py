"""Mixed precision: bf16 autocast on the CPU trains and tracks fp32; fp16 with GradScaler on CUDA only."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.runtime.precision import Precision

torch.set_num_threads(1)


class DtypeProbe(nn.Module):
    """A small MLP regression that records the dtype its hidden activations were computed in."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(4, 16)
        self.out = nn.Linear(16, 1)
        self.seen: set[torch.dtype] = set()

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = self.hidden(x)
        self.seen.add(h.dtype)
        pred = self.out(torch.tanh(h)).sum(-1)
        result = {"logits": pred}
        if labels is not None:
            result["loss"] = nn.functional.mse_loss(pred.float(), labels)
        return result


def _data(n: int = 64) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0])
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def _train(tmp_path, device_kwargs: dict, **precision) -> tuple[list[float], DtypeProbe]:
    torch.manual_seed(0)
    model = DtypeProbe()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=3,
                             learning_rate=0.02, logging_steps=1, save_strategy="no", report_to=[],
                             disable_tqdm=True, seed=0, **device_kwargs, **precision)
    trainer = Trainer(model=model, args=args, train_dataset=_data())
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h], model


def test_bf16_autocast_on_cpu_tracks_fp32(tmp_path) -> None:
    fp32, fp32_model = _train(tmp_path / "fp32", {"use_cpu": True})
    bf16, bf16_model = _train(tmp_path / "bf16", {"use_cpu": True}, bf16=True)
    assert fp32_model.seen == {torch.float32}
    assert bf16_model.seen == {torch.bfloat16}  # autocast really ran the linear layers in bf16
    assert len(bf16) == len(fp32) == 24
    assert bf16[-1] < 0.5 * bf16[0]  # it trains
    np.testing.assert_allclose(bf16, fp32, rtol=0.05, atol=0.02)  # and follows the fp32 curve
    assert bf16 != fp32  # ... without being the same computation
    assert all(p.dtype == torch.float32 for p in bf16_model.parameters())  # master weights stay fp32


def test_precision_objects_are_no_ops_when_disabled() -> None:
    plain = Precision(torch.device("cpu"))
    assert not plain.enabled and not plain.scaler.is_enabled()
    with plain.autocast():
        assert not torch.is_autocast_enabled("cpu")
    bf16 = Precision(torch.device("cpu"), dtype=torch.bfloat16)
    with bf16.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16
    assert not bf16.scaler.is_enabled()


def _fp16_run(tmp_path, device_kwargs: dict, *, emulate_on_cpu: bool = False) -> tuple[Trainer, DtypeProbe]:
    """24 steps of fp16 with a GradScaler; on the CPU, fp16 is switched on after the arguments refused it (CPU
    autocast computes in float16 and ``torch.amp.GradScaler("cpu")`` scales, as on CUDA)."""
    torch.manual_seed(0)
    model = DtypeProbe()
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, num_train_epochs=3,
                             learning_rate=0.02, logging_steps=1, save_strategy="no", report_to=[],
                             disable_tqdm=True, seed=0, max_grad_norm=1.0, fp16=not emulate_on_cpu, **device_kwargs)
    args.fp16 = True
    trainer = Trainer(model=model, args=args, train_dataset=_data())
    trainer.train()
    return trainer, model


def _assert_grad_scaler_recipe(trainer: Trainer, model: DtypeProbe) -> None:
    """What holds whatever the first overflows (upstream's GradScaler recipe): every halving of the scale is one skipped
    step, whose gradient norm is not finite and which does not advance the schedule; the applied steps' norms are the
    unscaled ones (finite, not ~65536x); it trains; the weights stay fp32."""
    scaler, history = trainer.backend.scaler, trainer.state.log_history
    assert model.seen == {torch.float16}
    skipped = round(math.log2(65536.0 / scaler.get_scale()))  # no growth in 24 steps (growth_interval=2000)
    norms = [h["grad_norm"] for h in history if "grad_norm" in h]
    assert len(norms) == trainer.state.global_step == 24
    assert sum(not math.isfinite(n) for n in norms) == skipped == trainer._tw_run.loop.skipped_steps
    assert trainer.lr_scheduler.last_epoch == 24 - skipped  # upstream: the scheduler steps only when the step ran
    assert all(n < 100 for n in norms if math.isfinite(n))  # unscaled before clipping
    losses = [h["loss"] for h in history if "loss" in h]
    assert np.mean(losses[-4:]) < 0.5 * np.mean(losses[:4])  # it trains
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_grad_scaler_recipe_on_cpu(tmp_path) -> None:
    trainer, model = _fp16_run(tmp_path, {"use_cpu": True}, emulate_on_cpu=True)
    _assert_grad_scaler_recipe(trainer, model)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 with GradScaler needs a CUDA GPU")
def test_fp16_with_grad_scaler_on_cuda(tmp_path) -> None:
    trainer, model = _fp16_run(tmp_path / "fp16", {})
    _assert_grad_scaler_recipe(trainer, model)
    # the first steps may overflow and be skipped (the curve then lags fp32): compared once the scale has settled,
    # the last losses follow the fp32 run's last ones loosely
    fp32, _ = _train(tmp_path / "fp32", {})
    fp16 = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert np.mean(fp16[-4:]) == pytest.approx(np.mean(fp32[-4:]), rel=0.5, abs=0.05)
