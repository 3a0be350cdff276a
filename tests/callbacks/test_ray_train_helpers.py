"""trainwell.integrations.ray_train without a Ray cluster: what RayTrainReportCallback hands ``ray.train.report``
and what prepare_trainer changes (a stand-in ``ray.train`` records the calls; tests/distributed/test_ray_train.py
runs both on real Ray Train workers)."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from trainwell import Trainer
from trainwell.checkpoint.layout import verify_checkpoint
from trainwell.integrations.ray_train import RayTrainReportCallback, prepare_trainer


class FakeCheckpoint:
    """``ray.train.Checkpoint``: keeps a copy of the folder it is made from (Ray's report persists it)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def from_directory(cls, folder: str) -> "FakeCheckpoint":
        return cls(Path(folder))


class FakeIterable:
    """``ray.data.iterator._IterableFromIterator``: yields already collated batches (neither map-style nor a torch
    IterableDataset: the Trainer accepts it as a Ray object, for prepare_trainer's loader)."""

    def __init__(self, batches: list[dict[str, torch.Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)


FakeIterable.__module__ = "ray.data.iterator"  # what the Trainer's dataset check sees of Ray's class


@pytest.fixture
def fake_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[dict[str, Any], Path | None]]:
    """A stand-in ``ray`` package in ``sys.modules``; returns the list of (metrics, persisted checkpoint) reports."""
    reports: list[tuple[dict[str, Any], Path | None]] = []

    def report(metrics: dict[str, Any], checkpoint: FakeCheckpoint | None = None) -> None:
        kept = None
        if checkpoint is not None:
            kept = tmp_path / "persisted" / str(len(reports))
            shutil.copytree(checkpoint.path, kept)
        reports.append((dict(metrics), kept))

    ray = types.ModuleType("ray")
    train = types.ModuleType("ray.train")
    train.report, train.Checkpoint = report, FakeCheckpoint  # type: ignore[attr-defined]
    data = types.ModuleType("ray.data")
    iterator = types.ModuleType("ray.data.iterator")
    iterator._IterableFromIterator = FakeIterable  # type: ignore[attr-defined]
    ray.train, ray.data, data.iterator = train, data, iterator  # type: ignore[attr-defined]
    for name, module in {"ray": ray, "ray.train": train, "ray.data": data, "ray.data.iterator": iterator}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return reports


def test_each_save_reports_the_merged_metrics_and_a_verified_copy_of_the_checkpoint(fake_ray, tiny, make_args):
    args = make_args(max_steps=4, save_strategy="steps", save_steps=2, logging_steps=1)
    trainer = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=tiny.regression_data(32),
                      callbacks=[RayTrainReportCallback()])
    trainer.train()
    assert [metrics["step"] for metrics, _ in fake_ray] == [2, 4]
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert [metrics["loss"] for metrics, _ in fake_ray] == [logged[1], logged[3]]
    for (metrics, persisted), step in zip(fake_ray, (2, 4)):
        assert persisted is not None
        copy = persisted / RayTrainReportCallback.CHECKPOINT_NAME
        verify_checkpoint(copy)  # marker and every file survived the copy
        assert json.loads((copy / "trainer_state.json").read_text())["global_step"] == step


def test_a_resume_from_the_reported_copy_continues_the_run(fake_ray, tiny, make_args, tmp_path):
    args = make_args(max_steps=4, save_strategy="steps", save_steps=2, logging_steps=1)
    full = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=tiny.regression_data(32),
                   callbacks=[RayTrainReportCallback()])
    full.train()
    first_copy = fake_ray[0][1]
    assert first_copy is not None
    resumed = Trainer(model=tiny.RegressionModel(), args=make_args(max_steps=4, save_strategy="steps", save_steps=2,
                                                                   logging_steps=1, output_dir=str(tmp_path / "r")),
                      train_dataset=tiny.regression_data(32), callbacks=[RayTrainReportCallback()])
    resumed.train(resume_from_checkpoint=str(first_copy / RayTrainReportCallback.CHECKPOINT_NAME))
    for name, value in full.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


def test_prepare_trainer_reads_ray_iterables_batch_by_batch_and_keeps_other_datasets(fake_ray, tiny, make_args):
    batches = [{"x": torch.ones(3, 2), "labels": torch.zeros(3)}, {"x": torch.zeros(5, 2), "labels": torch.ones(5)}]
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(), train_dataset=FakeIterable(batches),
                      eval_dataset={"plain": tiny.regression_data(8), "ray": FakeIterable(batches)})
    assert prepare_trainer(trainer) is trainer
    assert isinstance(trainer, Trainer) and type(trainer).__name__ == "RayTransformersTrainer"
    seen = list(trainer.get_train_dataloader())
    assert [b["x"].shape[0] for b in seen] == [3, 5]
    assert [b["x"].shape[0] for b in trainer.get_eval_dataloader("ray")] == [3, 5]
    assert sum(b["x"].shape[0] for b in trainer.get_eval_dataloader("plain")) == 8
