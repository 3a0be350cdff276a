"""A pickle payload planted in any file a resume reads does not run: the load is refused, naming the file and the
opt-in (``trust_checkpoint_pickles``), and nothing is applied.

The payload is an object whose ``__reduce__`` is ``open(marker, "w")``: unpickling it creates the marker file. Each
planted file is re-sealed (the marker's checksums recomputed), as an attacker with write access would do, so that
the refusal comes from the pickle check and not from the checksum.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.checkpoint import layout
from trainwell.checkpoint.manager import CheckpointContents, CheckpointManager
from trainwell.checkpoint.safe_pickle import UnsafeCheckpointError, check_pickle_file
from trainwell.cli.commands.deepspeed_tools import cmd_zero_to_fp32


class Payload:
    """Unpickling this runs ``open(path, "w")``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        out = self.lin(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


def _reseal(folder: Path) -> None:
    layout.write_marker(folder, layout._fsync_tree(folder))


def _plant(path: Path, marker: Path) -> None:
    """Add the payload to a torch file's content (keeps it loadable by a trusting reader)."""
    original = torch.load(path, weights_only=False)
    torch.save({"original": original, "payload": Payload(marker)}, path)
    _reseal(path.parent if path.parent.name.startswith("checkpoint-") else path.parent.parent)


def _trained(tmp_path: Path, **kw) -> tuple[Path, TrainingArguments]:
    data = [{"x": torch.randn(3), "labels": torch.randn(())} for _ in range(8)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4,
                             max_steps=2, save_steps=1, report_to="none", disable_tqdm=True, **kw)
    torch.manual_seed(0)
    Trainer(model=Net(), args=args, train_dataset=data).train()
    return tmp_path / "out", args


def _resume(out: Path, args: TrainingArguments) -> None:
    data = [{"x": torch.randn(3), "labels": torch.randn(())} for _ in range(8)]
    Trainer(model=Net(), args=args, train_dataset=data).train(resume_from_checkpoint=True)


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_payload_in_a_trainer_file_is_refused(tmp_path, name):
    out, args = _trained(tmp_path)
    marker = tmp_path / "ran"
    _plant(out / "checkpoint-2" / name, marker)
    with pytest.raises(UnsafeCheckpointError, match=rf"{name}.*trust_checkpoint_pickles=True"):
        _resume(out, args)
    assert not marker.exists()


def test_training_args_bin_is_never_unpickled(tmp_path):
    out, args = _trained(tmp_path)
    marker = tmp_path / "ran"
    path = out / "checkpoint-2" / "training_args.bin"
    torch.save(Payload(marker), path)
    _reseal(path.parent)
    _resume(out, args)  # training_args.bin is written for upstream compatibility, never read on resume
    assert not marker.exists()


def test_dcp_metadata_payload_is_refused_and_genuine_metadata_passes(tmp_path):
    import torch.distributed.checkpoint as dcp

    folder = tmp_path / "checkpoint-1"
    state = {"model": {"w": torch.arange(4.0)}, "optimizer": {"step": torch.tensor(3)}}
    dcp.save(state, checkpoint_id=str(folder / "fsdp_state"))  # one process, no process group
    _reseal(folder)
    check_pickle_file(folder / "fsdp_state" / ".metadata")  # the genuine metadata is on the allow-list
    CheckpointManager(tmp_path).verify(folder)

    marker = tmp_path / "ran"
    metadata = folder / "fsdp_state" / ".metadata"
    with open(metadata, "rb") as handle:
        genuine = pickle.load(handle)
    with open(metadata, "wb") as handle:
        pickle.dump([genuine, Payload(marker)], handle)
    _reseal(folder)
    with pytest.raises(UnsafeCheckpointError, match=r"fsdp_state/\.metadata.*io\.open.*trust_checkpoint"):
        CheckpointManager(tmp_path).verify(folder)
    with pytest.raises(UnsafeCheckpointError, match=r"\.metadata"):
        CheckpointManager(tmp_path).load_latest_valid(CheckpointContents(model=Net()))
    assert not marker.exists()


def _deepspeed_like(folder: Path, marker: Path, planted: str) -> None:
    step = folder / "global_step1"
    step.mkdir(parents=True)
    (folder / "latest").write_text("global_step1")
    files = {"mp_rank_00_model_states.pt": {"module": {"lin.weight": torch.zeros(1, 3)}, "global_steps": 1},
             "zero_pp_rank_0_mp_rank_00_optim_states.pt": {"optimizer_state_dict": {"state": {}}}}
    for name, content in files.items():
        torch.save({**content, "payload": Payload(marker)} if name == planted else content, step / name)
    _reseal(folder)


@pytest.mark.parametrize("planted", ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"])
def test_deepspeed_payload_is_refused_on_resume_and_by_zero_to_fp32(tmp_path, planted):
    folder, marker = tmp_path / "checkpoint-1", tmp_path / "ran"
    _deepspeed_like(folder, marker, planted)
    with pytest.raises(UnsafeCheckpointError, match=rf"{planted}.*trust_checkpoint_pickles"):
        CheckpointManager(tmp_path).verify(folder)
    with pytest.raises(UnsafeCheckpointError, match=rf"{planted}.*--trust-checkpoint-pickles"):
        cmd_zero_to_fp32([str(folder), str(tmp_path / "w.safetensors")])
    assert not marker.exists()


def test_trust_opt_in_skips_the_scan(tmp_path):
    from fractions import Fraction  # harmless, but not on the allow-list

    folder = tmp_path / "checkpoint-1"
    (folder / "global_step1").mkdir(parents=True)
    torch.save({"ratio": Fraction(1, 3)}, folder / "global_step1" / "mp_rank_00_model_states.pt")
    _reseal(folder)
    with pytest.raises(UnsafeCheckpointError, match="fractions.Fraction"):
        CheckpointManager(tmp_path).verify(folder)
    CheckpointManager(tmp_path, trust_pickles=True).verify(folder)
    assert TrainingArguments(output_dir=str(tmp_path), trust_checkpoint_pickles=True).trust_checkpoint_pickles


def test_dotted_global_names_are_refused(tmp_path):
    # protocol 4 resolves "a.b.c" through attributes: an allowed module must not reach os.system through it
    path = tmp_path / "x.pt"
    def text(value: str) -> bytes:  # SHORT_BINUNICODE + MEMOIZE
        return b"\x8c" + bytes([len(value)]) + value.encode() + b"\x94"

    path.write_bytes(b"\x80\x04" + text("torch.distributed.checkpoint.metadata") + text("os.system") + b"\x93\x94.")
    with pytest.raises(UnsafeCheckpointError, match="os.system"):
        check_pickle_file(path)
