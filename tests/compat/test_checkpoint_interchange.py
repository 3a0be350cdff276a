"""Checkpoints interchange with the upstream ``transformers.Trainer``, in both directions, and foreign folders survive.

Every test runs the real upstream Trainer (``transformers`` + ``accelerate``) and trainwell on the same tiny model and
data in one process on the CPU:

- upstream writes ``checkpoint-3``; trainwell resumes from it (by path and with ``resume_from_checkpoint=True``) and
  ends with exactly the weights of the uninterrupted upstream run (``torch.equal``: bit-exact), also from the older
  upstream formats (``pytorch_model.bin``; sharded ``model-0000k-of-0000n.safetensors`` + index);
- trainwell writes ``checkpoint-3``; upstream resumes from it and ends with exactly trainwell's uninterrupted weights;
- a folder trainwell did not write (an upstream checkpoint, a user's file or folder) survives ``train()`` with every
  save and rotation setting, and is never counted by ``save_total_limit``.

Bit-exact across libraries needs the same random draws: the dropout model trains within one epoch (when an epoch
starts, upstream's DataLoader draws from the global random generator, trainwell's loader from its own seeded one, so
later dropout masks differ); across epochs the model has no dropout.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any
from helpers.tensors import weights
from helpers import NormalRows

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from torch import nn
from torch.nn import functional as F

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

import trainwell  # noqa: E402
from trainwell.checkpoint.layout import COMPLETE_MARKER, CheckpointError  # noqa: E402

pytestmark = pytest.mark.slow  # trains on both libraries per case: over a second a test

transformers.logging.set_verbosity_error()


class Net(nn.Module):
    """A two-layer regressor with optional dropout; counts calls of its own ``load_state_dict``."""

    def __init__(self, dropout: float = 0.0) -> None:
        super().__init__()
        self.a = nn.Linear(3, 5)
        self.drop = nn.Dropout(dropout)
        self.b = nn.Linear(5, 1)
        self.loads = 0

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        pred = self.b(self.drop(torch.tanh(self.a(x)))).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels), "logits": pred}

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        self.loads += 1
        return super().load_state_dict(state_dict, strict=strict, assign=assign)


# Within one epoch, with dropout: 29 samples / batch 4 = 8 batches (the last one short), 6 steps.
IN_EPOCH = dict(dropout=0.2, samples=29, steps=dict(max_steps=6))
# Across epochs, no dropout: 13 samples = 4 batches per epoch (last of 1), 2 epochs = 8 steps.
ACROSS_EPOCHS = dict(dropout=0.0, samples=13, steps=dict(num_train_epochs=2))
# The default weight_decay 0: upstream's two parameter groups with equal hyper-parameters.
NO_WEIGHT_DECAY = dict(ACROSS_EPOCHS, weight_decay=0.0)
# LoRA-like: only weights train (the biases are frozen), so upstream's no-decay group is empty: groups [2, 0].
LORA_LIKE = dict(ACROSS_EPOCHS, frozen_biases=True)
SETUPS = {"in_epoch_dropout": IN_EPOCH, "across_epochs": ACROSS_EPOCHS, "no_weight_decay": NO_WEIGHT_DECAY,
          "lora_like": LORA_LIKE}


def train(lib: Any, out: Path, setup: dict, resume: Any = None, **overrides: Any) -> tuple[Any, Net]:
    """Train with ``lib`` (``transformers`` or ``trainwell``); returns (trainer, model)."""
    torch.manual_seed(0)
    model = Net(setup["dropout"])
    if setup.get("frozen_biases"):
        for name, param in model.named_parameters():
            param.requires_grad_(not name.endswith("bias"))
    extra = {"report_to": "none", "use_cpu": True} if lib is transformers else {}
    kwargs = dict(output_dir=str(out), per_device_train_batch_size=4, learning_rate=0.05, save_steps=3,
                  logging_steps=1, seed=7, disable_tqdm=True, warmup_steps=2,
                  weight_decay=setup.get("weight_decay", 0.1),
                  **setup["steps"], **extra)
    kwargs.update(overrides)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(**kwargs), train_dataset=NormalRows(setup["samples"]))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, model


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key}: max diff {(a[key] - b[key]).abs().max().item()}"


@pytest.fixture(scope="module")
def upstream_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Uninterrupted upstream runs (trainwell resumes from their checkpoint-3): {setup: (output_dir, weights)}."""
    runs = {}
    for name, setup in SETUPS.items():
        out = tmp_path_factory.mktemp(f"upstream_{name}")
        _, model = train(transformers, out, setup)
        runs[name] = (out, weights(model))
    return runs


@pytest.fixture(scope="module")
def trainwell_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Uninterrupted trainwell runs: {setup: (output_dir, weights)}."""
    runs = {}
    for name, setup in SETUPS.items():
        out = tmp_path_factory.mktemp(f"trainwell_{name}")
        _, model = train(trainwell, out, setup)
        runs[name] = (out, weights(model))
    return runs


def _as_bin(folder: Path) -> None:
    """Rewrite the weights as older upstream versions did: ``torch.save(state_dict)`` into ``pytorch_model.bin``."""
    from safetensors.torch import load_file

    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()


def _as_shards(folder: Path) -> None:
    """Rewrite the weights as sharded safetensors + ``model.safetensors.index.json`` (huggingface_hub's writer)."""
    from huggingface_hub import save_torch_state_dict
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    save_torch_state_dict(state, folder, max_shard_size=64, metadata={"format": "pt"})
    assert (folder / "model.safetensors.index.json").is_file() and len(list(folder.glob("model-*.safetensors"))) > 1


# --------------------------------------------------------------------------------------- upstream -> trainwell
@pytest.mark.parametrize("setup_name", list(SETUPS))
@pytest.mark.parametrize("how", ["path", "True"])
def test_trainwell_resumes_an_upstream_checkpoint(upstream_runs, tmp_path, setup_name, how):
    up_out, up_final = upstream_runs[setup_name]
    source = up_out / "checkpoint-3"
    assert not (source / COMPLETE_MARKER).exists() and not (source / "data_state.json").exists()
    out = tmp_path / "out"
    shutil.copytree(source, out / "checkpoint-3")
    resume = str(out / "checkpoint-3") if how == "path" else True
    trainer, model = train(trainwell, out, SETUPS[setup_name], resume=resume)
    assert_same_weights(weights(model), up_final)  # bit-exact
    assert model.loads >= 1  # the model's own load_state_dict was called
    assert trainer.state.global_step == transformers.TrainerState.load_from_json(
        str(up_out / f"checkpoint-{trainer.state.global_step}" / "trainer_state.json")).global_step
    logged = [e["step"] for e in trainer.state.log_history if "loss" in e]
    assert logged == list(range(1, trainer.state.global_step + 1))  # upstream's history of steps 1-3 was kept
    upstream_log = json.loads((up_out / f"checkpoint-{trainer.state.global_step}" / "trainer_state.json").read_text())
    mine = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    theirs = [e["loss"] for e in upstream_log["log_history"] if "loss" in e]
    assert mine == pytest.approx(theirs, rel=1e-5)  # the first window after the resume is one step, as upstream's
    assert (out / "checkpoint-3").is_dir() and not (out / "checkpoint-3" / COMPLETE_MARKER).exists()  # untouched


@pytest.mark.parametrize("fmt", ["bin", "sharded"])
def test_trainwell_resumes_older_upstream_weight_formats(upstream_runs, tmp_path, fmt):
    up_out, up_final = upstream_runs["across_epochs"]
    out = tmp_path / "out"
    shutil.copytree(up_out / "checkpoint-3", out / "checkpoint-3")
    {"bin": _as_bin, "sharded": _as_shards}[fmt](out / "checkpoint-3")
    _, model = train(trainwell, out, ACROSS_EPOCHS, resume=True)
    assert_same_weights(weights(model), up_final)
    assert model.loads >= 1


def test_an_empty_marker_on_an_upstream_checkpoint_is_refused_naming_the_fix(upstream_runs, tmp_path):
    """``touch .complete`` on an upstream checkpoint: trainwell never writes an empty marker, so it reads as damage
    (emptied metadata must not turn the checksums off); the error says to delete the marker, and then the
    folder resumes as the foreign checkpoint it is."""
    up_out, up_final = upstream_runs["across_epochs"]
    out = tmp_path / "out"
    shutil.copytree(up_out / "checkpoint-3", out / "checkpoint-3")
    (out / "checkpoint-3" / COMPLETE_MARKER).touch()
    with pytest.raises(CheckpointError, match=r"completion marker is empty.*delete the empty marker"):
        train(trainwell, out, ACROSS_EPOCHS, resume=True)
    (out / "checkpoint-3" / COMPLETE_MARKER).unlink()
    _, model = train(trainwell, out, ACROSS_EPOCHS, resume=True)
    assert_same_weights(weights(model), up_final)


def test_a_damaged_upstream_checkpoint_is_a_clear_error_and_true_falls_back(upstream_runs, tmp_path):
    up_out, up_final = upstream_runs["across_epochs"]
    out = tmp_path / "out"
    for step in (3, 6):
        shutil.copytree(up_out / f"checkpoint-{step}", out / f"checkpoint-{step}")
    optimizer = out / "checkpoint-6" / "optimizer.pt"
    intact = optimizer.read_bytes()
    optimizer.write_bytes(intact[:100])  # truncated
    with pytest.raises(CheckpointError, match=r"checkpoint-6/optimizer\.pt: cannot read optimizer state"):
        train(trainwell, out, ACROSS_EPOCHS, resume=str(out / "checkpoint-6"))
    optimizer.write_bytes(intact)  # one fault at a time: now the weights are missing
    (out / "checkpoint-6" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"checkpoint-6: no model weights found; expected one of model\."):
        train(trainwell, out, ACROSS_EPOCHS, resume=str(out / "checkpoint-6"))
    with pytest.warns(UserWarning, match=r"checkpoint-6 is damaged .*falling back to .*checkpoint-3"):
        _, model = train(trainwell, out, ACROSS_EPOCHS, resume=True, save_steps=5)  # (a save at 6 would fail)
    assert_same_weights(weights(model), up_final)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-3", "checkpoint-5", "checkpoint-6", "checkpoint-8"]  # the damaged foreign folder was not deleted


# --------------------------------------------------------------------------------------- trainwell -> upstream
@pytest.mark.parametrize("setup_name", list(SETUPS))
@pytest.mark.parametrize("how", ["path", "True"])
def test_upstream_resumes_a_trainwell_checkpoint(trainwell_runs, tmp_path, setup_name, how):
    tw_out, tw_final = trainwell_runs[setup_name]
    out = tmp_path / "out"
    shutil.copytree(tw_out / "checkpoint-3", out / "checkpoint-3")
    resume = str(out / "checkpoint-3") if how == "path" else True
    trainer, model = train(transformers, out, SETUPS[setup_name], resume=resume)
    assert_same_weights(weights(model), tw_final)  # bit-exact
    assert trainer.state.global_step == (6 if setup_name == "in_epoch_dropout" else 8)


def test_trainwell_files_are_what_upstream_reads(trainwell_runs):
    import numpy as np
    from transformers.trainer_pt_utils import safe_globals

    folder = trainwell_runs["in_epoch_dropout"][0] / "checkpoint-3"
    saved = json.loads((folder / "trainer_state.json").read_text())
    upstream_fields = {f.name for f in __import__("dataclasses").fields(transformers.TrainerState)}
    assert set(saved) <= upstream_fields  # upstream's load_from_json is cls(**json): any other key fails
    state = transformers.TrainerState.load_from_json(str(folder / "trainer_state.json"))
    assert state.global_step == 3 and state.stateful_callbacks["TrainerControl"]["args"]["should_save"] is True
    with safe_globals():
        rng = torch.load(folder / "rng_state.pth", weights_only=True)  # exactly how upstream reads it
    assert {"python", "numpy", "cpu"} <= set(rng)
    np.random.set_state(rng["numpy"])
    scheduler = torch.load(folder / "scheduler.pt", weights_only=True)
    assert scheduler["last_epoch"] == 3 and scheduler["_step_count"] == 4


def test_both_write_upstreams_parameter_groups_with_the_empty_one(upstream_runs, trainwell_runs):
    """optimizer.pt and scheduler.pt have the same groups from both libraries: a LoRA-like model's [2, 0]."""
    layouts = {}
    for lib, runs in (("upstream", upstream_runs), ("trainwell", trainwell_runs)):
        for name in ("lora_like", "no_weight_decay"):
            folder = runs[name][0] / "checkpoint-3"
            optimizer = torch.load(folder / "optimizer.pt", weights_only=True)
            schedule = torch.load(folder / "scheduler.pt", weights_only=True)
            layouts[lib, name] = ([g["params"] for g in optimizer["param_groups"]],
                                  [g["weight_decay"] for g in optimizer["param_groups"]], sorted(optimizer["state"]),
                                  len(schedule["base_lrs"]))
    assert layouts["upstream", "lora_like"] == layouts["trainwell", "lora_like"] == ([[0, 1], []], [0.1, 0.0], [0, 1], 2)
    assert layouts["upstream", "no_weight_decay"] == layouts["trainwell", "no_weight_decay"] == (
        [[0, 1], [2, 3]], [0.0, 0.0], [0, 1, 2, 3], 2)


# --------------------------------------------------------------------------------------- a finished run
def test_resuming_a_finished_run_trains_no_further_step(upstream_runs, tmp_path, caplog):
    # 13 samples, batch 4, max_steps=3: the last step falls mid-epoch. Upstream trains a 4th step on resume.
    up_out, _ = upstream_runs["across_epochs"]
    out = tmp_path / "out"
    shutil.copytree(up_out / "checkpoint-3", out / "checkpoint-3")
    setup = dict(ACROSS_EPOCHS, steps=dict(max_steps=3))
    upstream_trainer, _ = train(transformers, tmp_path / "upstream", setup, resume=str(out / "checkpoint-3"))
    assert upstream_trainer.state.global_step == 4  # the upstream behaviour this fixes
    with caplog.at_level(logging.INFO, logger="trainwell"):
        trainer, model = train(trainwell, out, setup, resume=True)
    assert trainer.state.global_step == 3
    assert "Training is already complete" in caplog.text
    from safetensors.torch import load_file

    assert_same_weights(weights(model), load_file(out / "checkpoint-3" / "model.safetensors"))
    mine, _ = train(trainwell, tmp_path / "tw", setup)  # a finished trainwell run, requeued
    again, _ = train(trainwell, tmp_path / "tw", setup, resume=True)
    assert again.state.global_step == 3
    steps = [[e for e in t.state.log_history if "loss" in e] for t in (mine, again)]
    assert steps[0] == steps[1] and len(steps[0]) == 3
    assert again.state.log_history[-1]["train_loss"] == mine.state.log_history[-1]["train_loss"]


# --------------------------------------------------------------------------------------- foreign folders survive
SURVIVAL_SETTINGS = [
    dict(save_strategy="steps", save_steps=2, save_total_limit=None),
    dict(save_strategy="steps", save_steps=2, save_total_limit=1),
    dict(save_strategy="steps", save_steps=2, save_total_limit=2),
    dict(save_strategy="steps", save_steps=2, save_total_limit=1, overwrite_output_dir=True),
    dict(save_strategy="epoch", save_total_limit=1),
    dict(save_strategy="no"),
    dict(save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2, save_total_limit=1,
         load_best_model_at_end=True, metric_for_best_model="loss"),
    dict(save_strategy="best", eval_strategy="steps", eval_steps=2, save_total_limit=1, metric_for_best_model="loss"),
    dict(save_strategy="epoch", eval_strategy="epoch", save_total_limit=2, load_best_model_at_end=True),
]


@pytest.fixture(scope="module")
def upstream_checkpoint_50(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real upstream checkpoint at a step the trainwell runs below never reach."""
    out = tmp_path_factory.mktemp("upstream50")
    train(transformers, out, dict(ACROSS_EPOCHS, steps=dict(max_steps=50)), save_steps=50, logging_steps=50)
    return out / "checkpoint-50"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("settings", SURVIVAL_SETTINGS, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_foreign_checkpoints_and_user_files_survive_train(upstream_checkpoint_50, tmp_path, settings):
    out = tmp_path / "out"
    shutil.copytree(upstream_checkpoint_50, out / "checkpoint-50")
    (out / "checkpoint-7").mkdir()  # a user's folder with a checkpoint name (no marker)
    (out / "checkpoint-7" / "notes.txt").write_text("mine")
    (out / "user_data").mkdir()
    (out / "user_data" / "table.csv").write_text("a,b\n1,2\n")
    (out / "README.txt").write_text("keep me")
    before = {name: _snapshot(out / name) for name in ("checkpoint-50", "checkpoint-7", "user_data")}
    data = NormalRows(13)
    torch.manual_seed(0)
    args = trainwell.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=6,
                                       logging_steps=1, disable_tqdm=True, **settings)
    trainer = trainwell.Trainer(model=Net(), args=args, train_dataset=data,
                                eval_dataset=data if settings.get("eval_strategy") else None)
    trainer.train()
    for name, files in before.items():
        assert _snapshot(out / name) == files, f"{name} was changed"
    assert (out / "README.txt").read_text() == "keep me"
    own = sorted(p.name for p in out.iterdir() if (p / COMPLETE_MARKER).is_file())
    limit = settings.get("save_total_limit")
    if settings["save_strategy"] == "no":
        assert own == []
    elif limit:
        best = trainer.state.best_model_checkpoint
        assert len(own) <= limit + (1 if best and Path(best).name != own[-1] else 0)  # foreign folders don't count
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-") or p.name == ".trainwell.lock"]


def test_a_save_onto_a_foreign_folder_fails_and_keeps_it(upstream_checkpoint_50, tmp_path, caplog):
    out = tmp_path / "out"
    shutil.copytree(upstream_checkpoint_50, out / "checkpoint-4")  # sits where this run will save
    before = _snapshot(out / "checkpoint-4")
    args = trainwell.TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=6, save_steps=2,
                                       disable_tqdm=True)
    torch.manual_seed(0)
    trainer = trainwell.Trainer(model=Net(), args=args, train_dataset=NormalRows(13))
    with caplog.at_level(logging.WARNING, logger="trainwell"), \
            pytest.raises(CheckpointError, match=r"checkpoint-4 already exists and was not written by trainwell"):
        trainer.train()
    assert "checkpoint folders trainwell did not write" in caplog.text  # said at the start, before any step
    assert _snapshot(out / "checkpoint-4") == before
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file()
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-") or p.name == ".trainwell.lock"]
