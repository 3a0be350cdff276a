"""The Trainer's contract with its backend and its subclasses: every backend hook is in the Protocol (called, never
looked up by name), and a user subclass's own names never collide with trainwell's private state."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trainwell import Trainer
from trainwell.backends.base import Backend, Capabilities
from trainwell.backends.ddp import DDPBackend
from trainwell.backends.deepspeed.backend import DeepSpeedBackend
from trainwell.backends.fsdp import FSDPBackend
from trainwell.backends.single import SingleDeviceBackend


def _protocol_members() -> tuple[set[str], set[str]]:
    """(attributes, methods) the Backend Protocol declares."""
    attributes = set(Backend.__annotations__)
    methods = {name for name, value in vars(Backend).items() if inspect.isfunction(value) and not name.startswith("_")}
    return attributes, methods


def _assigned_in_init(cls: type) -> set[str]:
    """``self.<name> = ...`` targets of the ``__init__`` of ``cls`` and its bases (attributes an instance of a class
    not built here has)."""
    found: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and klass.__module__.startswith("trainwell."):
            tree = ast.parse(inspect.getsource(klass.__init__).strip())
            found |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name)
                      and node.value.id == "self"}
    return found


def test_single_device_backend_provides_every_hook_with_its_default(make_args):
    attributes, methods = _protocol_members()
    assert {"input_dtype", "engine", "scaler", "ds_config", "num_training_steps"} <= attributes
    assert {"gathered_parameters", "check_checkpoint"} <= methods
    backend = Trainer(model=torch.nn.Linear(2, 1), args=make_args()).backend
    assert type(backend) is SingleDeviceBackend
    missing = [name for name in attributes | methods if not hasattr(backend, name)]
    assert not missing, f"SingleDeviceBackend lacks the Protocol members {missing}"
    # the defaults: inputs keep their dtype, no engine, no DeepSpeed config, nothing gathered nor checked
    assert backend.input_dtype is None and backend.engine is None and backend.ds_config is None
    assert backend.scaler is not None and not backend.scaler.is_enabled()  # fp16 off: a disabled scaler
    with backend.gathered_parameters():
        pass
    assert backend.check_checkpoint(Path("missing-folder")) is None
    assert backend.caps.fixed_micro_batch_size is False


@pytest.mark.parametrize("cls", [DDPBackend, FSDPBackend, DeepSpeedBackend])
def test_every_backend_class_has_every_protocol_member(cls):
    attributes, methods = _protocol_members()
    own = _assigned_in_init(cls) | set(dir(cls))  # DeepSpeed is not built here: it needs the package and a group
    missing = sorted(name for name in attributes | methods if name not in own)
    assert not missing, f"{cls.__name__} lacks the Protocol members {missing}"


def test_deepspeed_backend_declares_a_fixed_micro_batch_size():
    source = inspect.getsource(DeepSpeedBackend.__init__)
    assert "fixed_micro_batch_size=True" in source
    assert Capabilities().fixed_micro_batch_size is False


def test_auto_find_batch_size_is_refused_by_a_backend_that_fixes_the_micro_batch(tiny, make_args):
    """loops/batch_size.py asks the capability (not ``args.deepspeed``): any backend declaring it is refused."""
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(auto_find_batch_size=True, max_steps=1),
                      train_dataset=tiny.regression_data(16))
    trainer.backend.caps = replace(trainer.backend.caps, fixed_micro_batch_size=True)
    with pytest.raises(ValueError, match="auto_find_batch_size is not supported with DeepSpeed"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer.backend.caps = replace(trainer.backend.caps, fixed_micro_batch_size=False)
    assert trainer.train().global_step == 1  # the same trainer trains once the backend allows it


# Private attributes trainwell sets on a Trainer with upstream's name and meaning (a subclass of upstream's Trainer
# reading them finds what it expects there); every other private one is trainwell's own and starts with ``_tw_``.
UPSTREAM_PRIVATE_ATTRIBUTES = {"_memory_tracker", "_past", "_train_batch_size", "_signature_columns",
                               "_created_lr_scheduler", "_eval_dataloaders"}


def _train_save_resume(cls: type, tiny, make_args) -> tuple[list[float], list[str], Trainer]:
    """Train 4 steps saving every 2, resume the last 2 from checkpoint-2, save the model: losses, files, trainer."""
    args = make_args(max_steps=4, save_strategy="steps", save_steps=2, logging_steps=1, eval_strategy="steps",
                     eval_steps=2)
    data = tiny.regression_data(32)
    torch.manual_seed(0)
    trainer = cls(model=tiny.RegressionModel(), args=args, train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    torch.manual_seed(1)  # other initial weights: the resume must replace them with checkpoint-2's
    resumed = cls(model=tiny.RegressionModel(), args=args, train_dataset=data, eval_dataset=data[:8])
    resumed.train(resume_from_checkpoint=str(Path(args.output_dir) / "checkpoint-2"))
    resumed.save_model()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    losses += [e["loss"] for e in resumed.state.log_history if "loss" in e and e["step"] > 2]
    return losses, sorted(p.name for p in Path(args.output_dir).iterdir()), resumed


class NamesLikeTrainwellsOwn(Trainer):
    """A user subclass of upstream's Trainer with private names of its own that trainwell once used itself."""

    def __init__(self, *args, **kwargs):
        self._parts = ["mine"]
        self._checkpoints, self._plan, self._device, self._async_saver = "mine", "mine", "mine", "mine"
        super().__init__(*args, **kwargs)

    def _loop(self):  # a method named like the attribute that held trainwell's loop state
        return "my loop"

    def _hub(self):
        return "my hub"

    _accelerator = "mine"
    _input_dtype = "mine"
    _step_learning_rate = "mine"


def test_a_subclass_with_private_names_like_trainwells_trains_saves_and_resumes_as_the_trainer(tiny, make_args,
                                                                                                tmp_path):
    plain_losses, plain_files, _ = _train_save_resume(Trainer, tiny, make_args)
    import shutil

    shutil.rmtree(Path(make_args().output_dir))
    losses, files, trainer = _train_save_resume(NamesLikeTrainwellsOwn, tiny, make_args)
    assert losses == plain_losses and len(losses) == 4 + 2  # identical losses, the resumed steps included
    assert losses[4:] == losses[2:4]  # the resume from checkpoint-2 retrains steps 3 and 4 exactly
    assert files == plain_files and {"checkpoint-2", "checkpoint-4", "model.safetensors"} <= set(files)
    assert trainer._loop() == "my loop" and trainer._hub() == "my hub" and trainer._parts == ["mine"]
    assert (trainer._checkpoints, trainer._plan, trainer._device, trainer._async_saver) == ("mine",) * 4


def test_trainwells_own_private_attributes_all_start_with_tw(tiny, make_args):
    """After training, evaluating, saving and building the accelerator view, every private attribute on the
    Trainer is upstream's or ``_tw_``-prefixed: a subclass's own ``_name`` cannot be overwritten by trainwell."""
    args = make_args(max_steps=2, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=1,
                     neftune_noise_alpha=None)
    data = tiny.regression_data(16)
    trainer = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=data, eval_dataset=data[:8])
    trainer.train()
    trainer.evaluate()
    trainer.predict(data[:4])
    trainer.save_model()
    assert trainer.accelerator.is_main_process
    foreign = sorted(name for name in vars(trainer) if name.startswith("_") and not name.startswith("_tw_")
                     and name not in UPSTREAM_PRIVATE_ATTRIBUTES)
    assert not foreign, f"private Trainer attributes neither upstream's nor _tw_-prefixed: {foreign}"
    assert {"_tw_checkpoints", "_tw_run"} <= set(vars(trainer))


def test_upstream_checkpoint_names_delegate_to_the_part_and_reach_a_subclass_override(tiny, make_args):
    """``_save_checkpoint`` and ``_rotate_checkpoints`` overrides are called by trainwell's own flow (as upstream's
    code calls them); ``_sorted_checkpoints`` and ``_load_from_checkpoint`` answer from the checkpoint part."""
    from safetensors.torch import load_file

    calls: list[str] = []

    class Recording(Trainer):
        def _save_checkpoint(self, model, trial, tr_loss=None):
            calls.append(f"save@{self.state.global_step}")
            return super()._save_checkpoint(model, trial, tr_loss=tr_loss)

        def _rotate_checkpoints(self, use_mtime=False, output_dir=None):
            calls.append("rotate")
            super()._rotate_checkpoints(use_mtime=use_mtime, output_dir=output_dir)

    args = make_args(max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=2)
    trainer = Recording(model=tiny.RegressionModel(), args=args, train_dataset=tiny.regression_data(64))
    trainer.train()
    assert calls == ["save@2", "save@4", "save@6", "rotate"]
    out = Path(args.output_dir)
    assert trainer._sorted_checkpoints() == [str(out / "checkpoint-4"), str(out / "checkpoint-6")]  # 2 rotated
    saved = load_file(str(out / "checkpoint-4" / "model.safetensors"))
    assert not all(torch.equal(p, saved[n]) for n, p in trainer.model.state_dict().items())  # step 6 moved on
    trainer._load_from_checkpoint(str(out / "checkpoint-4"))
    assert all(torch.equal(p, saved[n]) for n, p in trainer.model.state_dict().items())
