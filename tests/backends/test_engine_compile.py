"""``torch_compile`` under DeepSpeed compiles inside the engine (``engine.compile(backend=...,
compile_kwargs=...)``, as accelerate's ``_prepare_deepspeed``) and keeps the engine as the object the loop calls;
``torch.compile`` on the engine would wrap it in an ``OptimizedModule`` without its ``backward``/``step``. The choice
is the backend's capability (``caps.compiles_in_engine``), the loop never asks which backend it has."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.utils.model_utils import compile_model


class FakeEngine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def compile(self, backend="inductor", compile_kwargs=None):  # DeepSpeedEngine.compile's parameters
        self.calls.append({"backend": backend, "compile_kwargs": compile_kwargs})


def test_in_engine_compile_calls_engine_compile_and_keeps_the_engine(tmp_path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", torch_compile=True,
                             torch_compile_mode="max-autotune")
    engine = FakeEngine()
    assert compile_model(engine, args, in_engine=True) is engine
    assert engine.calls == [{"backend": "inductor", "compile_kwargs": {"mode": "max-autotune"}}]


def test_only_deepspeed_compiles_in_its_engine(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwell.backends.deepspeed import backend as ds_backend

    monkeypatch.setattr(ds_backend, "import_deepspeed", lambda *_: SimpleNamespace())  # no engine is built here
    monkeypatch.setattr(ds_backend, "ensure_process_group", lambda *a, **k: None)
    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    common = dict(use_cpu=True, report_to="none", save_strategy="no")
    ds = Trainer(model=nn.Linear(2, 1), args=TrainingArguments(str(tmp_path / "ds"), deepspeed=config, **common))
    single = Trainer(model=nn.Linear(2, 1), args=TrainingArguments(str(tmp_path / "one"), **common))
    assert ds.backend.caps.compiles_in_engine and not single.backend.caps.compiles_in_engine


def test_deepspeeds_engine_compile_takes_these_arguments() -> None:
    engine = pytest.importorskip("deepspeed.runtime.engine")
    params = inspect.signature(engine.DeepSpeedEngine.compile).parameters
    assert "backend" in params and "compile_kwargs" in params
