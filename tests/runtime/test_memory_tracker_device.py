"""``Trainer()`` sets the device up (``torch.cuda.set_device``, the process group under a
launcher) before its memory tracker starts, as upstream, whose arguments did it in ``__post_init__``; otherwise the
tracker's CUDA readings at start would be GPU 0's on every rank."""

from __future__ import annotations

import pytest
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.runtime import memory


@pytest.mark.slow  # over a second
def test_the_device_is_set_up_before_the_memory_tracker_starts(tmp_path, monkeypatch) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", skip_memory_metrics=False)
    assert not args.__dict__.get("_devices_set_up")
    at_start = []
    original = memory.TrainerMemoryTracker.start

    def start(self, stage=None):
        at_start.append(args.__dict__.get("_devices_set_up"))
        return original(self, stage or "init")  # (the tracker names its stage after its caller)

    monkeypatch.setattr(memory.TrainerMemoryTracker, "start", start)
    Trainer(model=nn.Linear(2, 1), args=args)
    assert at_start and at_start[0] is True
