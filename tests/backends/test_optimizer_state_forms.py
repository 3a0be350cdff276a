"""The forms of a checkpoint's optimizer state, the parts that need no second process: what a checkpoint's optimizer
state is and who may read it, FSDP's DCP state read into whole tensors, a one-process state cut into shards.

The resized jobs themselves (FSDP2 and ZeRO-2/3, 2 -> 1 and 1 -> 2) are ``tests/distributed/test_elastic_resume.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell.backends.optimizer_state_forms import (SavedOptimizer, check_resumable, load_dcp_unsharded,
                                                     saved_optimizer, shard_optimizer_state)
from trainwell.checkpoint.layout import CheckpointError


def _touch(folder: Path, *names: str) -> Path:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
    return folder


def _deepspeed_folder(folder: Path, ranks: int) -> Path:
    (folder / "latest").parent.mkdir(parents=True, exist_ok=True)
    (folder / "latest").write_text("global_step6")
    return _touch(folder, "global_step6/mp_rank_00_model_states.pt", "model.safetensors",
                  *[f"global_step6/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(ranks)],
                  *[f"rng_state_{r}.pth" for r in range(ranks)])


def test_what_a_checkpoint_holds(tmp_path):
    assert saved_optimizer(_deepspeed_folder(tmp_path / "ds", 2)) == SavedOptimizer("deepspeed", 2)
    assert saved_optimizer(_touch(tmp_path / "fsdp", "fsdp_state/.metadata", "rng_state_0.pth",
                                  "rng_state_1.pth", "rng_state_2.pth")) == SavedOptimizer("dcp", 3)
    assert saved_optimizer(_touch(tmp_path / "one", "optimizer.pt", "rng_state.pth")) == SavedOptimizer("torch", 1)
    assert saved_optimizer(_touch(tmp_path / "weights", "model.safetensors")) == SavedOptimizer("none", None)


def test_another_backend_is_refused_with_the_way_out(tmp_path):
    ds = _deepspeed_folder(tmp_path / "checkpoint-6", 2)
    with pytest.raises(ValueError) as caught:
        check_resumable(ds, deepspeed=False, world_size=1)
    message = str(caught.value)
    assert "written by DeepSpeed (2 process(es))" in message and "run (1 process(es)) trains without DeepSpeed" in message
    assert "same `deepspeed` config" in message and f"trainwell zero-to-fp32 {ds}" in message
    assert check_resumable(ds, deepspeed=True, world_size=1).form == "deepspeed"  # a resize: the backend converts

    fsdp = _touch(tmp_path / "checkpoint-3", "fsdp_state/.metadata", "rng_state_0.pth", "rng_state_1.pth")
    with pytest.raises(ValueError, match=r"written without DeepSpeed \(2 process\(es\); FSDP's sharded state"):
        check_resumable(fsdp, deepspeed=True, world_size=2)
    for form in ("dcp", "torch"):  # FSDP, DDP and one process read each other's state
        folder = fsdp if form == "dcp" else _touch(tmp_path / "checkpoint-9", "optimizer.pt")
        assert check_resumable(folder, deepspeed=False, world_size=4).form == form


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def _trained() -> tuple[nn.Module, torch.optim.Optimizer]:
    model = _Net()
    optimizer = torch.optim.AdamW([{"params": [model.fc1.weight, model.fc2.weight]},
                                   {"params": [model.fc1.bias, model.fc2.bias], "weight_decay": 0.0}], lr=0.1)
    for step in range(3):
        model(torch.full((3, 5), 0.1 * step + 0.2)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_an_fsdp_state_is_read_whole_into_one_process(tmp_path):
    """DCP's files (as FSDP writes them: FQN keys) read into a fresh unsharded model and optimizer restore every
    weight and Adam moment exactly, so the next step is the one the saving run would have taken."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model, optimizer = _trained()
    model_state, optim_state = get_state_dict(model, optimizer)
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp_path / "fsdp_state"))
    fresh = _Net()
    with torch.no_grad():
        fresh.fc1.weight.zero_()
    fresh_optimizer = torch.optim.AdamW([{"params": [fresh.fc1.weight, fresh.fc2.weight]},
                                         {"params": [fresh.fc1.bias, fresh.fc2.bias], "weight_decay": 0.0}], lr=0.1)
    load_dcp_unsharded(fresh, fresh_optimizer, tmp_path)
    for name, tensor in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    want, got = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert got["param_groups"] == want["param_groups"]
    for index, state in want["state"].items():
        for key, value in state.items():
            assert torch.equal(got["state"][index][key], value), (index, key)
    other = nn.Linear(2, 2)  # another model: DCP finds none of its keys
    with pytest.raises(CheckpointError, match="cannot read the sharded FSDP state"):
        load_dcp_unsharded(other, torch.optim.AdamW(other.parameters()), tmp_path)


def test_a_one_process_optimizer_state_must_fit_the_sharded_optimizer(tmp_path):
    model, optimizer = _trained()
    state = optimizer.state_dict()
    assert shard_optimizer_state(optimizer, state, tmp_path / "optimizer.pt")["state"].keys() == state["state"].keys()
    other = torch.optim.AdamW(model.parameters(), lr=0.1)  # one group, not two
    with pytest.raises(CheckpointError, match=r"groups have sizes \[2, 2\] in the checkpoint but \[4\] now"):
        shard_optimizer_state(other, state, tmp_path / "optimizer.pt")
