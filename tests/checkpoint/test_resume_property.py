"""Resume is bit-exact whatever the shape of the run: a property test over batch sizes, accumulation, epochs or
max_steps, save intervals, drop_last and the step at which the run dies (in-process: a callback raises after step k).

Run it wider with ``--hypothesis-seed=N`` and a larger ``max_examples`` when changing the loop (300 random runs passed).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch import nn

from trainwell import Trainer, TrainerCallback, TrainingArguments


class Net(nn.Module):
    """A small regression MLP with dropout (so the RNG stream matters)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Dropout(0.2), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pred = self.body(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


class Crash(Exception):
    """Stands for the process dying."""


class CrashAt(TrainerCallback):
    """Dies when step ``step + 1`` begins: step ``step`` is complete, with its checkpoint when one was due."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Crash


def _data(n: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, 3, generator=g)
    return [{"x": x[i], "labels": x[i].sum()} for i in range(n)]


def _run(out: str, data, plan: dict, callbacks=(), resume: bool = False) -> Trainer:
    args = TrainingArguments(output_dir=out, report_to="none", disable_tqdm=True, logging_steps=1, seed=3,
                             learning_rate=0.05, warmup_steps=2, save_strategy="steps", **plan)
    trainer = Trainer(model_init=Net, args=args, train_dataset=data, callbacks=list(callbacks))  # seeded init
    trainer.train(resume_from_checkpoint=True if resume else None)
    return trainer


def _losses(trainer: Trainer) -> list[tuple]:
    return [(e["step"], e["loss"], e["learning_rate"], e["grad_norm"]) for e in trainer.state.log_history
            if "loss" in e]


@settings(max_examples=20, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(7, 20), batch=st.integers(2, 4), ga=st.integers(1, 3),
       length=st.one_of(st.sampled_from([("num_train_epochs", e) for e in (1, 1.5, 2, 3)]),
                        st.tuples(st.just("max_steps"), st.integers(3, 12))),
       save_steps=st.integers(1, 3), drop_last=st.booleans(), crash_fraction=st.floats(0.05, 0.95))
@pytest.mark.slow  # over a second
def test_crash_anywhere_then_resume_is_bit_exact(tmp_path_factory, n, batch, ga, length, save_steps, drop_last,
                                                 crash_fraction):
    plan = dict(per_device_train_batch_size=batch, gradient_accumulation_steps=ga, save_steps=save_steps,
                dataloader_drop_last=drop_last, **dict([length]))
    data = _data(n)
    reference = _run(str(tmp_path_factory.mktemp("a")), data, plan)
    total = reference.state.global_step
    crash = max(1, int(total * crash_fraction))
    assume(save_steps <= crash < total)  # a checkpoint exists before the crash, and the crash comes before the end
    out = str(tmp_path_factory.mktemp("b"))
    with pytest.raises(Crash):
        _run(out, data, plan, callbacks=[CrashAt(crash)])
    resumed = _run(out, data, plan, resume=True)
    assert resumed.state.global_step == total
    for (name, a), b in zip(reference.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert _losses(resumed) == _losses(reference)
