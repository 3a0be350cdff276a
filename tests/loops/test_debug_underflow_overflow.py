"""debug="underflow_overflow": the detector stops an fp32 overflow and prints the frames; no hooks when off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.debug_utils import DebugOption, DebugUnderflowOverflow


class Blowup(nn.Module):
    """A linear layer, then a scale that overflows fp32 once its weight is huge."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Linear(4, 1, bias=False)
        with torch.no_grad():
            self.lin.weight.fill_(1.0)
            self.scale.weight.fill_(3e38)  # any |sum| > ~1.2 of the 4 features overflows fp32

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.scale(self.lin(x))
        loss = ((out.squeeze(-1) - labels) ** 2).mean()
        return {"loss": loss, "logits": out}


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(4, generator=g), "labels": torch.tensor(1.0)}


def test_detector_stops_the_training_and_prints_the_frames(tmp_path, capsys) -> None:
    args = TrainingArguments(str(tmp_path), debug="underflow_overflow", per_device_train_batch_size=4,
                             report_to="none", use_cpu=True, disable_tqdm=True)
    assert args.debug == [DebugOption.UNDERFLOW_OVERFLOW]
    model = Blowup()
    trainer = Trainer(model=model, args=args, train_dataset=Data())
    with pytest.raises(ValueError, match="DebugUnderflowOverflow: inf/nan detected"):
        trainer.train()
    out = capsys.readouterr().out
    assert "Detected inf/nan during batch_number=0" in out
    assert "Last 2 forward frames:" in out
    assert "abs min  abs max  metadata" in out
    assert " lin Linear" in out and " scale Linear" in out
    assert "output has infs" in out
    assert "3.00e+38 3.00e+38 weight" in out  # the scale layer's weight, in the upstream line format
    assert not any(m._forward_hooks for m in model.modules())  # taken off when train() ends


def test_no_hook_when_off(tmp_path) -> None:
    model = nn.Linear(4, 1)
    seen: list[int] = []

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = model

        def forward(self, x, labels=None):
            seen.append(sum(len(m._forward_hooks) for m in self.modules()))
            return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).mean()}

    args = TrainingArguments(str(tmp_path), per_device_train_batch_size=4, max_steps=2, report_to="none",
                             use_cpu=True, disable_tqdm=True, save_strategy="no")
    Trainer(model=Net(), args=args, train_dataset=Data()).train()
    assert seen == [0, 0]


def test_trace_batch_nums_and_abort_after(capsys) -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU())
    detector = DebugUnderflowOverflow(model, trace_batch_nums=[1], abort_after_batch_num=1)
    x = torch.ones(2, 3)
    model(x)
    assert capsys.readouterr().out == ""  # batch 0: recorded, not printed
    with pytest.raises(ValueError, match="aborting after 2 batches due to `abort_after_batch_num=1`"):
        model(x)
    out = capsys.readouterr().out
    assert " 0 Linear" in out and " 1 ReLU" in out and "input[0]" in out
    detector.remove()
    assert not any(m._forward_hooks for m in model.modules())
    model(x)  # no hook left


def test_max_frames_to_save_bounds_the_report(capsys) -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(5)], nn.Softmax(dim=-1))
    with torch.no_grad():
        model[4].weight.fill_(float("inf"))
    DebugUnderflowOverflow(model, max_frames_to_save=3)
    with pytest.raises(ValueError, match="inf/nan detected"):
        model(torch.ones(1, 2))
    out = capsys.readouterr().out
    assert "Last 3 forward frames:" in out and "weight has infs" in out
