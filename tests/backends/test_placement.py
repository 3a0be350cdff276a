"""Where the Trainer leaves the model (upstream ``Trainer.__init__``'s ``place_model_on_device``): FSDP and DeepSpeed
place it themselves when they prepare it (the Trainer never moves the whole fp32 model first); one device and DDP
get it moved by ``Trainer()``; a ``device_map`` model (model parallel) is never moved nor wrapped in DataParallel."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.backends import registry
from trainwell.backends.placement import is_model_parallel, places_itself
from trainwell.backends.single import SingleDeviceBackend
from trainwell.runtime.distributed import LaunchEnv
from trainwell.runtime.precision import Precision


class Recorded(nn.Module):
    """A model whose ``.to(...)`` calls are recorded (a CPU cannot show a move to another device)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 1)
        self.to_calls: list[tuple] = []

    def to(self, *args, **kwargs):
        self.to_calls.append((args, kwargs))
        return super().to(*args, **kwargs)

    def forward(self, x, labels=None):
        pred = self.b(self.a(x)).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


def _args(tmp_path, **kw) -> TrainingArguments:
    return TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", **kw)


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry sees a 2-rank launch (no process group is created: the backends need none to be built)."""
    monkeypatch.setattr(registry, "read_launch_env", lambda *_: LaunchEnv(rank=0, world_size=2, local_rank=0,
                                                                        local_world_size=2))
    monkeypatch.setattr(registry, "init_process_group", lambda *a, **k: None)


def test_fsdp_trainer_leaves_the_model_for_the_backend_to_shard(tmp_path, two_ranks) -> None:
    model = Recorded()
    trainer = Trainer(model=model, args=_args(tmp_path, fsdp="full_shard"))
    assert type(trainer.backend).__name__ == "FSDPBackend" and trainer.backend.caps.places_model
    assert model.to_calls == [] and trainer.place_model_on_device is False


def test_ddp_trainer_still_moves_the_model(tmp_path, two_ranks) -> None:
    model = Recorded()
    trainer = Trainer(model=model, args=_args(tmp_path))
    assert type(trainer.backend).__name__ == "DDPBackend"
    assert len(model.to_calls) == 1 and trainer.place_model_on_device is True


def test_deepspeed_trainer_leaves_the_model_for_the_engine(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainwell.backends.deepspeed import backend as ds_backend

    monkeypatch.setattr(ds_backend, "import_deepspeed", lambda *_: SimpleNamespace())  # no engine is built here
    monkeypatch.setattr(ds_backend, "ensure_process_group", lambda *a, **k: None)
    config = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}
    model = Recorded()
    trainer = Trainer(model=model, args=_args(tmp_path, deepspeed=config))
    assert type(trainer.backend).__name__ == "DeepSpeedBackend" and trainer.backend.caps.places_model
    assert model.to_calls == [] and trainer.place_model_on_device is False


def test_single_device_trainer_moves_the_model(tmp_path) -> None:
    model = Recorded()
    trainer = Trainer(model=model, args=_args(tmp_path))
    assert len(model.to_calls) == 1 and trainer.place_model_on_device is True
    assert not trainer.is_model_parallel


def test_full_eval_dtype_leaves_placement_to_evaluation(tmp_path) -> None:
    model = Recorded()
    trainer = Trainer(model=model, args=_args(tmp_path, bf16_full_eval=True))  # upstream: cast and placed at eval
    assert model.to_calls == [] and trainer.place_model_on_device is False


class DeviceMapped(Recorded):
    """What ``from_pretrained(device_map=...)`` leaves: ``hf_device_map`` over two GPUs."""

    def __init__(self, device_map: dict) -> None:
        super().__init__()
        self.hf_device_map = device_map


def test_device_map_rule_is_upstreams() -> None:
    assert is_model_parallel(DeviceMapped({"a": 0, "b": 1}), "cpu")  # several devices
    assert not is_model_parallel(DeviceMapped({"a": "cpu", "b": "disk"}), "cpu")  # cpu/disk do not count
    assert is_model_parallel(DeviceMapped({"": 0}), "cpu")  # one device, not the trainer's
    assert not is_model_parallel(DeviceMapped({"": "cuda:0"}), "cuda:0")
    assert not is_model_parallel(Recorded(), "cpu")
    assert places_itself(SimpleNamespace(quantization_method="bitsandbytes"), "cpu")


def test_device_map_model_is_not_moved_nor_wrapped_in_data_parallel(tmp_path) -> None:
    args = _args(tmp_path)
    env, device, _ = args._runtime()
    args.__dict__["_runtime_cache"] = (env, device, 2)  # as if this process saw 2 GPUs (DataParallel)
    model = DeviceMapped({"a": 0, "b": 1})
    trainer = Trainer(model=model, args=args)
    assert trainer.is_model_parallel and not trainer.place_model_on_device
    assert args.n_gpu == 1 and args.train_batch_size == args.per_device_train_batch_size  # upstream: n_gpu forced to 1
    wrapped = trainer.backend.prepare_model(model, training=True)
    assert wrapped is model and model.to_calls == []  # neither DataParallel nor .to()


def test_several_gpus_still_wrap_a_plain_model_in_data_parallel() -> None:
    backend = SingleDeviceBackend(torch.device("cpu"), Precision(torch.device("cpu")), n_gpu=2)
    model = Recorded()
    assert isinstance(backend.prepare_model(model, training=True), nn.DataParallel) and len(model.to_calls) == 1
