"""``fsdp_sync_module_states: true`` (seed 003's accelerate config) makes every rank train from rank 0's weights.

Each rank builds its model with a different seed; with the key set, the gathered weights after a step with a zero
learning rate are rank 0's initial ones, without it they mix both ranks' (the check that the key is read at all).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.launch import run_json, torchrun

JOB = """
import json, os, sys
import torch
from torch import nn
sys.path.insert(0, {here!r})
from jobs import finish
from trainwell import Trainer, TrainingArguments

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 1)
    def forward(self, x, labels=None):
        pred = self.b(torch.tanh(self.a(x))).squeeze(-1)
        return {{"loss": nn.functional.mse_loss(pred, labels), "logits": pred}}

rank = int(os.environ["RANK"])
out = {{}}
for sync in (True, False):
    torch.manual_seed(100 + rank)  # a different initialisation on every rank
    model = Net()
    init = {{k: v.clone() for k, v in model.state_dict().items()}}
    init0 = [None, None]
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo")
    torch.distributed.all_gather_object(init0, init)
    data = [{{"x": torch.randn(4), "labels": torch.randn(())}} for _ in range(8)]
    args = TrainingArguments(output_dir={out!r} + f"/{{sync}}", use_cpu=True, per_device_train_batch_size=2,
                             max_steps=1, learning_rate=0.0, save_strategy="no", report_to="none",
                             disable_tqdm=True, fsdp="full_shard", fsdp_config={{"fsdp_sync_module_states": sync}})
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    full = trainer.backend.full_state_dict()
    if rank == 0:
        out[str(sync)] = {{"equals_rank0": all(torch.equal(full[k], init0[0][k]) for k in full),
                          "equals_rank1": all(torch.equal(full[k], init0[1][k]) for k in full)}}
finish(Path({result!r}), out)
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_sync_module_states_broadcasts_rank0_weights(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    job = tmp_path / "job.py"
    here = str(Path(__file__).resolve().parent)
    job.write_text("from pathlib import Path\n" + JOB.format(here=here, out=str(tmp_path), result=str(result)))
    found = run_json(torchrun(job), result, "the 2-rank sync_module_states job", timeout=300)
    assert found["True"] == {"equals_rank0": True, "equals_rank1": False}
    assert found["False"] == {"equals_rank0": False, "equals_rank1": False}  # the shards of two initialisations
