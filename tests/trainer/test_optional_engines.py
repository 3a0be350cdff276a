"""Optional engines are imported only by the runs that use them: a plain run that saves checkpoints imports neither
DeepSpeed (whose import prints "Setting accelerator to CPU" mid-training) nor accelerate nor transformers."""

from __future__ import annotations

import json
import sys

import pytest

SCRIPT = """
import json, sys
import torch
from torch import nn
from trainwell import Trainer, TrainingArguments

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(2, 1)
    def forward(self, x, labels=None):
        return {"loss": self.l(x).pow(2).mean()}

args = TrainingArguments(output_dir=sys.argv[1], max_steps=2, save_steps=1, report_to="none", disable_tqdm=True)
Trainer(model=M(), args=args, train_dataset=[{"x": torch.ones(2)}] * 4).train()
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules} & {"deepspeed", "accelerate", "transformers"})))
"""


@pytest.mark.slow
def test_a_plain_run_with_checkpoints_imports_no_optional_engine(tmp_path):
    from helpers.launch import run

    done = run([sys.executable, "-c", SCRIPT, tmp_path / "out"], "the plain run", timeout=300)
    assert (tmp_path / "out" / "checkpoint-2").is_dir()
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
    assert "Setting accelerator" not in done.stdout
