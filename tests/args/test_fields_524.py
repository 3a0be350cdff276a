"""The TrainingArguments fields transformers 5.24 added (train_sampling_strategy, dataloader_in_order,
dataloader_multiprocessing_context, use_cache, project, trackio_*) and what each does, against upstream where it is
installed: the training order, the DataLoader options, the model's cache flag, the Trackio run."""

from __future__ import annotations

import importlib.machinery
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from helpers.models import RegressionModel

from trainwell import Trainer, TrainingArguments

NEW_FIELDS = {"train_sampling_strategy": "random", "dataloader_in_order": True,
              "dataloader_multiprocessing_context": None, "use_cache": False, "project": "huggingface",
              "trackio_space_id": None, "trackio_bucket_id": None, "trackio_static_space_id": None,
              "parallelism_config": None}


def _numbered(n: int = 12) -> list[dict[str, torch.Tensor]]:
    """Rows whose label is their index, so a batch tells which rows it holds."""
    return [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(n)]


def _order(loader) -> list[int]:
    return [int(v) for batch in loader for v in batch["labels"].tolist()]


def test_the_new_fields_have_upstream_defaults(tmp_path):
    args = TrainingArguments(str(tmp_path))
    assert {name: getattr(args, name) for name in NEW_FIELDS} == NEW_FIELDS
    transformers = pytest.importorskip("transformers")
    theirs = transformers.TrainingArguments(str(tmp_path / "up"), report_to="none")
    assert {name: getattr(theirs, name) for name in NEW_FIELDS} == NEW_FIELDS


@pytest.mark.parametrize("strategy", ["sequential", "random"])
def test_train_sampling_strategy_gives_upstream_order(tmp_path, strategy):
    """'sequential' reads the dataset in its order; 'random' shuffles with the seed: the same order as upstream's
    ``get_train_dataloader`` on the same dataset and seed."""
    data = _numbered()
    args = TrainingArguments(str(tmp_path / "tw"), per_device_train_batch_size=4, seed=3,
                             train_sampling_strategy=strategy, report_to="none")
    ours = _order(Trainer(model=RegressionModel(), args=args, train_dataset=data).get_train_dataloader())
    assert sorted(ours) == list(range(12))
    assert (ours == list(range(12))) == (strategy == "sequential")
    transformers = pytest.importorskip("transformers")
    up_args = transformers.TrainingArguments(str(tmp_path / "up"), per_device_train_batch_size=4, seed=3,
                                             train_sampling_strategy=strategy, report_to="none", use_cpu=True)
    transformers.set_seed(3)
    upstream = transformers.Trainer(model=RegressionModel(), args=up_args, train_dataset=data)
    assert ours == _order(upstream.get_train_dataloader())


def test_group_by_length_is_the_seeds_name_of_the_strategy(tmp_path):
    from trainwell.data.samplers import LengthGroupedSampler, ResumableSampler

    old = TrainingArguments(str(tmp_path), group_by_length=True)
    assert old.train_sampling_strategy == "group_by_length" and old.group_by_length
    new = TrainingArguments(str(tmp_path), train_sampling_strategy="group_by_length")
    assert new.group_by_length
    rows = [{"input_ids": torch.ones(1 + i % 5, dtype=torch.long)} for i in range(10)]
    trainer = Trainer(model=RegressionModel(), args=new, train_dataset=rows)
    assert isinstance(trainer._get_train_sampler(), LengthGroupedSampler)
    import dataclasses

    copy = dataclasses.replace(old, train_sampling_strategy="sequential")  # a library's copy wins with its strategy
    assert copy.train_sampling_strategy == "sequential" and not copy.group_by_length
    sampler = Trainer(model=RegressionModel(), args=copy, train_dataset=rows)._get_train_sampler()
    assert isinstance(sampler, ResumableSampler) and list(sampler) == list(range(10))


def test_unknown_or_unsupported_strategies_are_refused(tmp_path):
    with pytest.raises(ValueError, match="train_sampling_strategy='shuffled' is not valid"):
        TrainingArguments(str(tmp_path), train_sampling_strategy="shuffled")
    with pytest.raises(NotImplementedError, match="train_sampling_strategy='batch_rebalance' is not supported"):
        TrainingArguments(str(tmp_path), train_sampling_strategy="batch_rebalance")


@pytest.mark.slow
def test_kto_config_sequential_sampling_is_honoured(tmp_path):
    """KTOConfig declares train_sampling_strategy='sequential' (its KL term pairs neighbours): under the patch,
    the Trainer's training batches follow the dataset's order, as upstream's do."""
    pytest.importorskip("trl")
    code = textwrap.dedent("""
        import sys, torch, trainwell
        trainwell.patch_transformers()
        from trl import KTOConfig
        from helpers.models import RegressionModel
        args = KTOConfig(output_dir=sys.argv[1], per_device_train_batch_size=4, report_to="none", bf16=False,
                         gradient_checkpointing=False)
        assert isinstance(args, trainwell.TrainingArguments), type(args).__mro__
        rows = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(12)]
        loader = trainwell.Trainer(model=RegressionModel(), args=args, train_dataset=rows).get_train_dataloader()
        print(args.train_sampling_strategy, [int(v) for b in loader for v in b["labels"].tolist()])
    """)
    from helpers import launch

    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=240,
                         env=launch.child_env(), cwd=str(launch.ROOT / "tests"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == f"sequential {list(range(12))}"


def test_dataloader_worker_options_reach_the_loader(tmp_path):
    args = TrainingArguments(str(tmp_path), dataloader_num_workers=1, dataloader_multiprocessing_context="spawn",
                             dataloader_in_order=False, report_to="none")
    loader = Trainer(model=RegressionModel(), args=args, train_dataset=_numbered()).get_train_dataloader()
    assert loader.multiprocessing_context.get_start_method() == "spawn"
    assert loader.in_order is False
    with pytest.raises(ValueError, match="dataloader_multiprocessing_context needs dataloader_num_workers > 0"):
        TrainingArguments(str(tmp_path), dataloader_multiprocessing_context="fork")
    with pytest.raises(ValueError, match="dataloader_multiprocessing_context='thread' is not valid"):
        TrainingArguments(str(tmp_path), dataloader_num_workers=1, dataloader_multiprocessing_context="thread")


@pytest.mark.parametrize("use_cache", [False, True])
def test_use_cache_is_written_into_the_model_config(tmp_path, use_cache):
    """As upstream: the Trainer sets ``model.config.use_cache = args.use_cache`` when it is built."""
    model = RegressionModel()
    model.config = types.SimpleNamespace(use_cache=not use_cache)
    Trainer(model=model, args=TrainingArguments(str(tmp_path), use_cache=use_cache, report_to="none"))
    assert model.config.use_cache is use_cache
    transformers = pytest.importorskip("transformers")
    theirs = RegressionModel()
    theirs.config = types.SimpleNamespace(use_cache=not use_cache)
    transformers.Trainer(model=theirs, args=transformers.TrainingArguments(
        str(tmp_path / "up"), use_cache=use_cache, report_to="none", use_cpu=True))
    assert theirs.config.use_cache is use_cache


class _FakeTrackio(types.ModuleType):
    """What TrackioCallback calls, recorded."""

    def __init__(self) -> None:
        super().__init__("trackio")
        self.__spec__ = importlib.machinery.ModuleSpec("trackio", None)
        self.calls: list[tuple[str, dict]] = []
        self.context_vars = types.SimpleNamespace(current_space_id=types.SimpleNamespace(get=lambda: "me/space"))

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda **kwargs: self.calls.append((name, kwargs))


@pytest.mark.parametrize("static", [None, "me/static", False])
def test_trackio_gets_the_project_space_bucket_and_static_space(tmp_path, monkeypatch, static):
    from trainwell.callbacks.integrations.trackio import TrackioCallback
    from trainwell.utils.trainer_state import TrainerControl, TrainerState

    fake = _FakeTrackio()
    monkeypatch.setitem(sys.modules, "trackio", fake)
    args = TrainingArguments(str(tmp_path), project="proj", trackio_space_id="space", trackio_bucket_id="me/bucket",
                             trackio_static_space_id=static, report_to="none")
    callback, state = TrackioCallback(), TrainerState()
    callback.setup(args, state, RegressionModel())
    callback.on_train_end(args, state, TrainerControl())
    init = fake.calls[0]
    assert init[0] == "init" and init[1]["project"] == "proj" and init[1]["space_id"] == "space"
    assert init[1]["bucket_id"] == "me/bucket"
    freezes = [kwargs for name, kwargs in fake.calls if name == "freeze"]
    if static is False:
        assert freezes == []
    else:
        assert freezes[0]["space_id"] == "me/space" and freezes[0]["project"] == "proj"
        assert freezes[0]["new_space_id"] == static if static else freezes[0]["new_space_id"].startswith("proj-static-")


def test_parallelism_config_holds_data_parallelism_only(tmp_path):
    """None by default (upstream's value too: TRL's GRPOConfig reads it); accelerate's ParallelismConfig asking for
    tensor/context/sequence parallelism or a sharded data dimension is refused, a data-parallel one kept and written by
    ``to_dict``."""
    accelerate = pytest.importorskip("accelerate.parallelism_config")
    with pytest.raises(NotImplementedError, match=r"parallelism_config asks for \{'tp_size': 2\}"):
        TrainingArguments(str(tmp_path), parallelism_config=accelerate.ParallelismConfig(tp_size=2))
    with pytest.raises(ValueError, match="must be an accelerate ParallelismConfig"):
        TrainingArguments(str(tmp_path), parallelism_config="tp_size=2")
    args = TrainingArguments(str(tmp_path), parallelism_config=accelerate.ParallelismConfig(dp_replicate_size=1))
    assert args.to_dict()["parallelism_config"]["dp_replicate_size"] == 1
    import json

    json.loads(args.to_json_string())
