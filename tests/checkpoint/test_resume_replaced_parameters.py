"""A resume whose ``_load_from_checkpoint`` replaces the model's parameters (``load_state_dict(..., assign=True)``).

Upstream loads the weights first and builds the optimizer after, so such an override trains on. The optimizer built
before the load must not be left stepping the replaced parameters (silent: the weights would never change again):
the resumed run equals the uninterrupted one (the ground truth), and where the optimizer cannot be built again (one
passed to the Trainer) the resume is refused, naming the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import RegressionModel, regression_data
from trainwell import Trainer, TrainingArguments

STEPS, SAVE_AT = 6, 3


class AssigningTrainer(Trainer):
    """Loads the checkpoint's weights by replacing the model's parameters (new tensors, not copies)."""

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        state = load_file(str(Path(resume_from_checkpoint) / "model.safetensors"))
        self.model.load_state_dict(state, assign=True)


def args(out: Path) -> TrainingArguments:
    return TrainingArguments(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, learning_rate=0.05,
                             optim="adamw_torch", lr_scheduler_type="linear", save_strategy="steps",
                             save_steps=SAVE_AT, logging_steps=1, report_to="none", use_cpu=True, disable_tqdm=True,
                             seed=0)


def weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def test_resume_with_assigned_parameters_trains_on_like_the_uninterrupted_run(tmp_path: Path) -> None:
    data = regression_data(32)
    torch.manual_seed(0)
    straight = Trainer(model=RegressionModel(), args=args(tmp_path / "run"), train_dataset=data)
    straight.train()
    expected = weights(straight.model)
    checkpoint = tmp_path / "run" / f"checkpoint-{SAVE_AT}"
    at_checkpoint = load_file(str(checkpoint / "model.safetensors"))

    resumed = AssigningTrainer(model=RegressionModel(), args=args(tmp_path / "resumed"), train_dataset=data)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    got = weights(resumed.model)
    assert any(not torch.equal(got[name], at_checkpoint[name]) for name in got)  # training went on after the load
    held = {id(p) for group in resumed.optimizer.param_groups for p in group["params"]}
    assert all(id(p) in held for p in resumed.model.parameters())
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6)
    def losses_after_resume(trainer: Trainer) -> list[float]:
        return [e["loss"] for e in trainer.state.log_history if "loss" in e and e["step"] > SAVE_AT]

    assert len(losses_after_resume(resumed)) == STEPS - SAVE_AT
    assert losses_after_resume(resumed) == pytest.approx(losses_after_resume(straight), rel=1e-5)


def test_resume_that_orphans_a_given_optimizer_is_refused_with_the_fix(tmp_path: Path) -> None:
    data = regression_data(32)
    torch.manual_seed(0)
    first = RegressionModel()
    Trainer(model=first, args=args(tmp_path / "run"), train_dataset=data,
            optimizers=(torch.optim.SGD(first.parameters(), lr=0.05), None)).train()
    model = RegressionModel()
    trainer = AssigningTrainer(model=model, args=args(tmp_path / "resumed"), train_dataset=data,
                               optimizers=(torch.optim.SGD(model.parameters(), lr=0.05), None))
    with pytest.raises(RuntimeError, match=r"assign=True.*passed to the Trainer.*without assign=True"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{SAVE_AT}"))
