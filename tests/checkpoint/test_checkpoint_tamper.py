"""A changed checkpoint is detected before anything is loaded, and every rank falls back to the same checkpoint.

One flipped byte in any file kind (weights, optimizer, scheduler, RNG, json state) fails the marker's checksum; a
truncated file fails its size. ``resume_from_checkpoint=True`` falls back to the previous checkpoint and the run ends
exactly as an uninterrupted one; an explicit path raises. The distributed cases (2 ranks, gloo): a damaged
``rng_state_1.pth`` (a file only rank 1 reads) and a truncated DCP shard (resealed, so that DCP itself fails while
loading and raises its ``BaseException`` subclass) and a DeepSpeed checkpoint missing rank 1's ZeRO shard (the state
the old save order left) make *both* ranks fall back to ``checkpoint-6``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers.launch import ROOT, child_env, run, torchrun
from trainwell import Trainer, TrainingArguments
from trainwell.checkpoint import layout
from trainwell.checkpoint.layout import CheckpointError
from trainwell.checkpoint.manager import CheckpointManager

JOB = ROOT / "tests" / "distributed" / "kill_job.py"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(4, 1)

    def forward(self, x, labels=None):
        pred = self.out(self.drop(torch.tanh(self.lin(x)))).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


def _data() -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)
    return [{"x": torch.randn(3, generator=gen), "labels": torch.randn((), generator=gen)} for _ in range(12)]


def _train(out: Path, resume=None, **kw) -> Trainer:
    args = TrainingArguments(output_dir=str(out), use_cpu=True, per_device_train_batch_size=2, max_steps=6,
                             save_steps=2, learning_rate=0.05, seed=3, report_to="none", disable_tqdm=True, **kw)
    torch.manual_seed(0)
    trainer = Trainer(model=Net(), args=args, train_dataset=_data())
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def _flip(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    where = len(data) // 2 if offset is None else offset
    data[where] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    out = tmp_path_factory.mktemp("tamper") / "out"
    trainer = _train(out)
    return out, {k: v.clone() for k, v in trainer.model.state_dict().items()}


def _copy(trained, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    shutil.rmtree(out / "checkpoint-6")  # resume from checkpoint-4 must train steps 5 and 6 again
    return out


KINDS = ["model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
         "data_state.json", "training_args.json"]


@pytest.mark.parametrize("name", KINDS)
def test_flipped_byte_in_each_file_kind_is_detected(trained, tmp_path, name):
    out = _copy(trained, tmp_path)
    _flip(out / "checkpoint-4" / name)
    with pytest.raises(CheckpointError, match=rf"{name}: the file's xxh3_128 checksum .* differs"):
        CheckpointManager(out).verify(out / "checkpoint-4")
    CheckpointManager(out).verify(out / "checkpoint-2")


def test_truncated_file_is_detected(trained, tmp_path):
    out = _copy(trained, tmp_path)
    path = out / "checkpoint-4" / "optimizer.pt"
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: file has \d+ bytes but \d+ were written"):
        CheckpointManager(out).verify(out / "checkpoint-4")


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt"])
def test_resume_falls_back_past_a_flipped_byte_and_ends_exactly(trained, tmp_path, name):
    out = _copy(trained, tmp_path)
    _flip(out / "checkpoint-4" / name)
    with pytest.warns(UserWarning, match=rf"checkpoint-4 is damaged .*{name}.*falling back to .*checkpoint-2"):
        trainer = _train(out, resume=True)
    for key, value in trained[1].items():
        assert torch.equal(trainer.model.state_dict()[key], value), key


def test_explicit_path_with_a_flipped_byte_raises(trained, tmp_path):
    out = _copy(trained, tmp_path)
    _flip(out / "checkpoint-4" / "scheduler.pt")
    with pytest.raises(CheckpointError, match=r"scheduler\.pt: the file's xxh3_128 checksum"):
        _train(out, resume=str(out / "checkpoint-4"))


@pytest.mark.parametrize("marker", [
    {"format": 1, "files": {"model.safetensors": 10}},  # sizes only: nothing to verify the content against
    {"format": 2, "checksum": "xxh3_128", "files": {"model.safetensors": {"size": 10}}},  # a file without checksum
    {"files": {}},
    ["model.safetensors"],
], ids=["sizes-only", "no-checksum", "no-format", "a-list"])
def test_a_marker_trainwell_did_not_write_is_refused_and_resume_falls_back(trained, tmp_path, marker):
    out = _copy(trained, tmp_path)
    folder = out / "checkpoint-4"
    (folder / layout.COMPLETE_MARKER).write_text(json.dumps(marker))
    with pytest.raises(CheckpointError, match=r"\.complete: the completion marker is not a trainwell marker record of "
                                              r"format 2 .*delete the marker"):
        CheckpointManager(out).verify(folder)
    with pytest.warns(UserWarning, match=r"checkpoint-4 is damaged .*not a trainwell marker.*falling back to "
                                         r".*checkpoint-2"):
        _train(out, resume=True)


def test_emptied_marker_is_damage_and_resume_falls_back_past_a_flipped_optimizer_byte(trained, tmp_path):
    out = _copy(trained, tmp_path)
    folder = out / "checkpoint-4"
    (folder / layout.COMPLETE_MARKER).write_bytes(b"")  # metadata emptied by a crash
    _flip(folder / "optimizer.pt")  # and damaged content the lost checksums would have caught
    with pytest.raises(CheckpointError, match=r"\.complete: the completion marker is empty"):
        CheckpointManager(out).verify(folder)
    with pytest.warns(UserWarning, match=r"checkpoint-4 is damaged .*marker is empty.*falling back to .*checkpoint-2"):
        trainer = _train(out, resume=True)
    for key, value in trained[1].items():
        assert torch.equal(trainer.model.state_dict()[key], value), key


def test_temp_folder_of_an_earlier_incarnation_with_the_same_pid_is_promoted(trained, tmp_path):
    """A container restarted in a fresh PID namespace: the new trainer has the pid of the one that died between
    the marker and the rename; its sealed temporary folder is promoted (no steps lost), not taken for a live save."""
    import os

    out = tmp_path / "out"
    shutil.copytree(trained[0], out)
    os.rename(out / "checkpoint-6", out / f".tmp-checkpoint-6-{os.getpid()}")
    (out / f".tmp-checkpoint-8-{os.getpid()}").mkdir()  # and an unsealed one: removed
    trainer = _train(out, resume=True)
    assert trainer.state.global_step == 6 and (out / "checkpoint-6" / layout.COMPLETE_MARKER).is_file()
    assert not [p.name for p in out.iterdir() if p.name.startswith(".tmp-")]
    for key, value in trained[1].items():  # resumed at step 6: nothing retrained, the weights are the saved ones
        assert torch.equal(trainer.model.state_dict()[key], value), key


# ------------------------------------------------------------------------------------------------ 2 ranks


def _launch(out: Path, backend: str) -> subprocess.CompletedProcess:
    env = child_env(drop=("KILL_JOB_AT_STEP", "TRAINWELL_TEST_KILL_AT"), DS_ACCELERATOR="cpu")
    return run(torchrun(JOB, out, backend), f"the 2-rank {backend} job", timeout=400, env=env, merge=False,
               check=False)


def _truncate_shard_and_reseal(folder: Path) -> None:
    shard = folder / "fsdp_state" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    layout.write_marker(folder, layout._fsync_tree(folder))  # the marker agrees: DCP itself must fail


def _drop_rank1_zero_shard_and_reseal(folder: Path) -> None:
    # the state the old save order could leave: 'latest' written, rank 1's shard not (a marker that agrees with it)
    (folder / "global_step9" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    layout.write_marker(folder, layout._fsync_tree(folder))


def test_deepspeed_file_check_names_the_missing_shard(tmp_path):
    from trainwell.backends.deepspeed import check_deepspeed_files

    step = tmp_path / "global_step3"
    step.mkdir()
    (tmp_path / "latest").write_text("global_step3")
    (step / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (step / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
    check_deepspeed_files(tmp_path, rank=0, zero_stage=2)
    with pytest.raises(CheckpointError, match=r"rank 1's ZeRO optimizer shard"):
        check_deepspeed_files(tmp_path, rank=1, zero_stage=2)
    (tmp_path / "latest").write_text("global_step4")
    with pytest.raises(CheckpointError, match=r"global_step4 named by 'latest'"):
        check_deepspeed_files(tmp_path, rank=0, zero_stage=2)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("backend,damage,reason", [
    ("ddp", lambda folder: _flip(folder / "rng_state_1.pth"), "rng_state_1.pth: the file's xxh3_128 checksum"),
    ("fsdp", _truncate_shard_and_reseal, "cannot read the sharded FSDP state"),
    pytest.param("zero2", _drop_rank1_zero_shard_and_reseal, "rank 1's ZeRO optimizer shard",
                 marks=pytest.mark.deepspeed),
])
def test_damage_seen_by_one_rank_makes_every_rank_fall_back(tmp_path, backend, damage, reason):
    from safetensors.torch import load_file

    if backend == "zero2":
        pytest.importorskip("deepspeed")

    out = tmp_path / "out"
    first = _launch(out, backend)
    assert first.returncode == 0, first.stderr[-4000:]
    want = load_file(str(out / "final.safetensors"))
    for name in ("final.safetensors", "result.json"):
        (out / name).unlink()
    shutil.rmtree(out / "checkpoint-12")
    damage(out / "checkpoint-9")
    again = _launch(out, backend)
    log = again.stdout + again.stderr
    assert again.returncode == 0, log[-6000:]
    assert "RANK0 BEGIN_STEP 6" in log and "RANK1 BEGIN_STEP 6" in log, log[-4000:]
    assert "falling back to" in log and "checkpoint-6 (every rank)" in log and reason in log, log[-4000:]
    got = load_file(str(out / "final.safetensors"))
    for key, value in want.items():
        assert torch.equal(got[key], value), key
