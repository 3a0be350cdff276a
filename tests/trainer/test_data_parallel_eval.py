"""With several GPUs in one process evaluation runs through ``nn.DataParallel`` too, as
upstream's ``evaluation_loop`` (``_wrap_model(self.model, training=False)`` wraps the model when ``n_gpu > 1``).
The CPU shows the decision: with the trainer's GPU count set to 2 (DataParallel without GPUs calls its module), the
model ``prediction_step`` receives is a DataParallel around ``trainer.model``, the metrics equal one device's, and
with one GPU (or a model already wrapped) nothing is wrapped."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        pred = self.lin(x).squeeze(-1)
        return {"loss": ((pred - labels) ** 2).mean(), "pred": pred}


def _data() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 2, generator=g), torch.randn(6, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(6)]


class Recording(Trainer):
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        self.models_seen.append(model)
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)


def _evaluate(tmp_path, n_gpu: int) -> tuple[Recording, dict[str, float]]:
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
                             per_device_eval_batch_size=3, disable_tqdm=True)
    trainer = Recording(model=Net(), args=args, eval_dataset=_data())
    trainer.models_seen = []
    trainer._tw_n_gpu = n_gpu  # as with n_gpu GPUs visible to this process
    return trainer, trainer.evaluate()


def test_evaluation_is_wrapped_in_data_parallel_with_several_gpus(tmp_path) -> None:
    trainer, metrics = _evaluate(tmp_path / "dp", 2)
    assert len(trainer.models_seen) == 2
    assert all(type(m) is nn.DataParallel and m.module is trainer.model for m in trainer.models_seen)
    assert not isinstance(trainer.model, nn.DataParallel)  # the trainer's own model is left unwrapped
    single, single_metrics = _evaluate(tmp_path / "one", 1)
    assert all(m is single.model for m in single.models_seen)
    assert metrics["eval_loss"] == pytest.approx(single_metrics["eval_loss"], rel=1e-6)


def test_an_already_wrapped_model_is_not_wrapped_twice(tmp_path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no")
    trainer = Trainer(model=Net(), args=args, eval_dataset=_data())
    trainer._tw_n_gpu = 2
    trainer.model = nn.DataParallel(trainer.model)
    assert trainer._model_for_eval() is trainer.model
