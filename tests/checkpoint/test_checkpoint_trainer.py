"""The Trainer's checkpoints: damaged-checkpoint fallback, rotation with the best model, data skipping without reads,
save_only_model, save_strategy="best", get_last_checkpoint, ignore_data_skip, crash left-overs, preemption."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import signal
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.checkpoint.layout import CheckpointError
from trainwell.data.samplers import ResumableSampler
from trainwell.trainer_utils import get_last_checkpoint
from helpers import train_until_preempted
from helpers.tensors import weights

torch.set_num_threads(1)


class RecordingDataset(torch.utils.data.Dataset):
    """Rows ``{"x", "labels"}`` (a fixed regression set) that records every index read."""

    def __init__(self, count: int = 8, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(count, 3, generator=generator)
        self.y = self.x.sum(dim=1, keepdim=True)
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        self.read.append(int(index))
        return {"x": self.x[index], "labels": self.y[index]}


class Regressor(nn.Module):
    """Linear regression returning ``{"loss", "logits"}``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pred = self.linear(x)
        out = {"logits": pred}
        if labels is not None:
            out["loss"] = nn.functional.mse_loss(pred, labels)
        return out


class ConstantData(torch.utils.data.Dataset):
    """``count`` identical rows ``x=1, labels=target`` (shuffling cannot change anything)."""

    def __init__(self, target: float, count: int = 2) -> None:
        self.target, self.count = target, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": torch.ones(1), "labels": torch.tensor([self.target])}


class Scalar(nn.Module):
    """``pred = w * x`` with ``w`` starting at 0: trained towards 2, its loss on target 0.8 first falls, then rises."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pred = self.w * x
        return {"logits": pred, "loss": nn.functional.mse_loss(pred, labels)}


def make_args(out: Path, **overrides) -> TrainingArguments:
    options = dict(output_dir=str(out), use_cpu=True, seed=7, per_device_train_batch_size=2, num_train_epochs=2,
                   learning_rate=0.05, save_strategy="steps", save_steps=2, logging_steps=1, report_to="none",
                   disable_tqdm=True, lr_scheduler_type="constant")
    options.update(overrides)
    return TrainingArguments(**options)


def regression_trainer(out: Path, dataset: RecordingDataset | None = None, **overrides) -> Trainer:
    torch.manual_seed(0)
    return Trainer(model=Regressor(), args=make_args(out, **overrides), train_dataset=dataset or RecordingDataset())


def scalar_trainer(out: Path, **overrides) -> Trainer:
    options = dict(optim="sgd", learning_rate=0.1, max_grad_norm=0.0, max_steps=8, eval_strategy="steps", eval_steps=2, save_steps=2,
                   metric_for_best_model="eval_loss")
    options.update(overrides)
    return Trainer(model=Scalar(), args=make_args(out, **options), train_dataset=ConstantData(2.0),
                   eval_dataset=ConstantData(0.8))


def names(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".tmp-")))


# ------------------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("damage", ["truncate_weights", "delete_optimizer"])
def test_damaged_newest_checkpoint_falls_back_to_previous_with_warning(tmp_path: Path, damage: str) -> None:
    regression_trainer(tmp_path, max_steps=4).train()
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-4"]
    newest = tmp_path / "checkpoint-4"
    if damage == "truncate_weights":
        target = newest / "model.safetensors"
        target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    else:
        (newest / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match="model.safetensors|optimizer.pt"):  # an explicit path: no fallback
        regression_trainer(tmp_path, max_steps=4).train(resume_from_checkpoint=str(newest))
    trainer = regression_trainer(tmp_path, max_steps=6)
    with pytest.warns(UserWarning, match=r"checkpoint-4 is damaged .*falling back to .*checkpoint-2"):
        trainer.train(resume_from_checkpoint=True)
    logged_steps = [e["step"] for e in trainer.state.log_history if "loss" in e]
    assert logged_steps == [1, 2, 3, 4, 5, 6]  # steps 3-4 were trained again from checkpoint-2's state
    assert trainer.state.global_step == 6


@pytest.mark.slow
def test_half_written_checkpoints_are_ignored_and_cleaned_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    regression_trainer(tmp_path, max_steps=4).train()
    unmarked = tmp_path / "checkpoint-6"
    shutil.copytree(tmp_path / "checkpoint-4", unmarked)
    (unmarked / ".complete").unlink()  # a crash in the middle of a (non-trainwell) copy: a foreign, broken folder
    (unmarked / "model.safetensors").unlink()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    tmp_left = tmp_path / f".tmp-checkpoint-8-{proc.pid}"  # trainwell's own write, its process is dead
    shutil.copytree(tmp_path / "checkpoint-4", tmp_left)
    (tmp_left / ".complete").unlink()
    trainer = regression_trainer(tmp_path, max_steps=5)
    with caplog.at_level(logging.INFO, logger="trainwell.trainer.trainer"), \
            pytest.warns(UserWarning, match=r"checkpoint-6 is damaged .*model weights.*falling back to .*checkpoint-4"):
        trainer.train(resume_from_checkpoint=True)
    assert f"Resuming training from {tmp_path / 'checkpoint-4'}" in caplog.text
    assert "Removed incomplete checkpoint folders" in caplog.text
    assert unmarked.exists() and not tmp_left.exists()  # the foreign folder is not trainwell's to delete
    assert [e["step"] for e in trainer.state.log_history if "loss" in e] == [1, 2, 3, 4, 5]


def test_get_last_checkpoint(tmp_path: Path) -> None:
    assert get_last_checkpoint(tmp_path) is None
    regression_trainer(tmp_path, max_steps=6, save_steps=3).train()
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    (tmp_path / f".tmp-checkpoint-9-{os.getpid()}").mkdir()  # a trainwell save in progress: not a checkpoint yet
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    (tmp_path / "checkpoint-10").mkdir()  # no marker: another tool's checkpoint counts, as upstream
    assert get_last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    with pytest.raises(CheckpointError, match=r"checkpoint-10: no model weights found"):  # validated when loaded
        regression_trainer(tmp_path, max_steps=6).train(resume_from_checkpoint=get_last_checkpoint(tmp_path))


# ---------------------------------------------------------------------------------------- best and rotation


def test_rotation_limit_1_keeps_best_and_newest_and_loads_best_at_end(tmp_path: Path) -> None:
    trainer = scalar_trainer(tmp_path, save_total_limit=1, load_best_model_at_end=True)
    trainer.train()
    evals = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e]
    assert evals.index(min(evals)) == 0 and len(evals) == 4  # best at step 2, then worse: best != newest
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-8"]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    assert trainer.state.best_metric == min(evals)
    from trainwell.checkpoint.weights import load_state_dict_from_folder

    best = load_state_dict_from_folder(tmp_path / "checkpoint-2")
    newest = load_state_dict_from_folder(tmp_path / "checkpoint-8")
    assert torch.equal(trainer.model.w.detach(), best["w"]) and not torch.equal(best["w"], newest["w"])


def test_save_strategy_best_saves_only_improvements(tmp_path: Path) -> None:
    trainer = scalar_trainer(tmp_path, save_strategy="best", eval_steps=1, max_steps=5)
    trainer.train()
    evals = [e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e]
    improved = [i + 1 for i, v in enumerate(evals) if v == min(evals[: i + 1])]
    assert improved == [1, 2]
    assert names(tmp_path) == ["checkpoint-1", "checkpoint-2"]
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")


def test_save_only_model_writes_weights_without_training_state(tmp_path: Path) -> None:
    trainer = regression_trainer(tmp_path, max_steps=2, save_only_model=True)
    trainer.train()
    files = sorted(p.name for p in (tmp_path / "checkpoint-2").iterdir())
    assert "model.safetensors" in files and "trainer_state.json" in files and ".complete" in files
    assert not {"optimizer.pt", "scheduler.pt", "rng_state.pth"} & set(files)
    from trainwell.checkpoint.weights import load_state_dict_from_folder

    saved = load_state_dict_from_folder(tmp_path / "checkpoint-2")
    assert all(torch.equal(saved[k], v) for k, v in weights(trainer.model).items())


def test_save_model_and_save_state(tmp_path: Path) -> None:
    trainer = regression_trainer(tmp_path / "run", max_steps=2, save_strategy="no")
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    trainer.save_state()
    assert {"model.safetensors", "training_args.bin"} <= set(os.listdir(tmp_path / "final"))
    assert (tmp_path / "run" / "trainer_state.json").is_file()
    fresh = Regressor()
    from trainwell.checkpoint.weights import load_model_weights

    load_model_weights(fresh, tmp_path / "final")
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in weights(trainer.model).items())


# ------------------------------------------------------------------------------------------ data position


def epoch_order(seed: int, epoch: int, count: int = 8) -> list[int]:
    sampler = ResumableSampler(count, seed=seed)
    sampler.set_epoch(epoch)
    return sampler.rank_order()


def test_resume_never_reads_skipped_samples(tmp_path: Path) -> None:
    regression_trainer(tmp_path, save_steps=1, gradient_accumulation_steps=2, max_steps=3).train()
    data = RecordingDataset()
    # checkpoint-3 = 1.5 epochs of 2 optimizer steps (4 micro-batches of 2): 4 of epoch 1's 8 samples consumed.
    trainer = regression_trainer(tmp_path, data, gradient_accumulation_steps=2)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert trainer.state.global_step == 4
    assert data.read == epoch_order(7, 1)[4:]  # exactly the remaining samples, in the interrupted order


def test_ignore_data_skip_restarts_the_interrupted_epoch(tmp_path: Path) -> None:
    regression_trainer(tmp_path, max_steps=2).train()  # 4 steps per epoch: checkpoint-2 is half-way into epoch 0
    data = RecordingDataset()
    trainer = regression_trainer(tmp_path, data, ignore_data_skip=True)
    trainer.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert trainer.state.global_step == 8
    # Epoch 0 is read again from its start (6 more steps reach max_steps=8 two steps into epoch 1); the loader reads
    # one batch ahead of the step, as upstream's (accelerate's) does.
    assert data.read == epoch_order(7, 0) + epoch_order(7, 1)[:4 + 2]


# ---------------------------------------------------------------------------------------------- preemption


class SendSignal(TrainerCallback):
    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum = step, signum

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)
        return control


def test_sigint_stops_after_the_step_with_a_checkpoint(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    before = signal.getsignal(signal.SIGINT)
    trainer = regression_trainer(tmp_path, save_steps=2)
    trainer.add_callback(SendSignal(3, signal.SIGINT))
    with caplog.at_level(logging.WARNING, logger="trainwell.trainer.trainer"):
        output = train_until_preempted(trainer)
    assert trainer.preempted and output.global_step == 3
    assert names(tmp_path) == ["checkpoint-2", "checkpoint-3"]
    assert "preempted by SIGINT at step 3" in caplog.text
    assert signal.getsignal(signal.SIGINT) is before  # the handler is gone after train()
    resumed = regression_trainer(tmp_path)
    resumed.train(resume_from_checkpoint=True)
    assert not resumed.preempted and resumed.state.global_step == 8


def test_preemption_with_save_strategy_no_saves_nothing(tmp_path: Path) -> None:
    trainer = regression_trainer(tmp_path, save_strategy="no")
    trainer.add_callback(SendSignal(2, signal.SIGTERM))
    train_until_preempted(trainer)
    assert trainer.preempted and trainer.state.global_step == 2
    assert not tmp_path.exists() or names(tmp_path) == []


def test_disk_full_during_a_save_is_a_clear_error_and_keeps_earlier_checkpoints(tmp_path, monkeypatch):
    import errno

    from trainwell.checkpoint import manager as manager_module
    from trainwell.checkpoint.layout import list_complete_checkpoints

    data = [{"x": torch.randn(2), "labels": torch.randn(())} for _ in range(16)]
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=4, save_steps=2,
                             report_to="none", disable_tqdm=True)
    trainer = Trainer(model=_DiskModel(), args=args, train_dataset=data)
    real_save = manager_module._torch_save
    calls = {"n": 0}

    def filling_disk(obj, path):
        if trainer.state.global_step >= 4:  # the second checkpoint hits a full disk half-way
            calls["n"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, path)

    monkeypatch.setattr(manager_module, "_torch_save", filling_disk)
    with pytest.raises(OSError, match=r"no space left .*checkpoint-4.*intact \(newest: .*checkpoint-2\).*save_total_limit"):
        trainer.train()
    assert calls["n"] == 1
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["checkpoint-2"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]
    resumed = Trainer(model=_DiskModel(), args=args, train_dataset=data)
    monkeypatch.setattr(manager_module, "_torch_save", real_save)
    assert resumed.train(resume_from_checkpoint=True).global_step == 4


class _DiskModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, x, labels=None):
        pred = self.linear(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(pred, labels), "logits": pred}
