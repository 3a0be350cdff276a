"""A plain save imports no optional engine: transformers' ``save_pretrained`` unwraps the model through accelerate,
which imports DeepSpeed whenever it is installed (5 s inside a run's first checkpoint); trainwell's save keeps it
out while nothing else imported it (:mod:`trainwell.utils.idle_engines`)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402  (imported once per process, not in the test)

from trainwell import Trainer, TrainingArguments  # noqa: E402
from trainwell.utils import idle_engines  # noqa: E402


class _RefuseDeepSpeed(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``deepspeed`` installed but never imported: ``find_spec`` answers (availability checks pass), an import is
    recorded and refused."""

    def __init__(self) -> None:
        self.attempts: list[str] = []

    def find_spec(self, name, path=None, target=None):
        if name == "deepspeed" or name.startswith("deepspeed."):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.attempts.append(module.__name__)
        raise ImportError(f"test: {module.__name__} must not be imported by a plain save")


@pytest.fixture
def no_deepspeed(monkeypatch):
    """``deepspeed`` as in a fresh process that never imported it; an import attempt is recorded and refused."""
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        monkeypatch.delitem(sys.modules, name)
    finder = _RefuseDeepSpeed()
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    return finder


def _tiny_gpt2():
    import torch

    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=32, n_positions=16, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def test_a_plain_checkpoint_of_a_transformers_model_does_not_import_deepspeed(tmp_path, no_deepspeed):
    import accelerate.utils.other as other

    before = other.is_deepspeed_available
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=_tiny_gpt2(), args=args)
    trainer.save_model(str(tmp_path / "model"))
    trainer.create_optimizer_and_scheduler(num_training_steps=2)
    trainer.state.global_step = 1
    trainer._save_checkpoint(trainer.model, trial=None)
    assert (tmp_path / "model" / "model.safetensors").is_file() and (tmp_path / "checkpoint-1" / "config.json").is_file()
    assert no_deepspeed.attempts == [] and "deepspeed" not in sys.modules
    assert other.is_deepspeed_available is before  # accelerate's name is restored after the save


def test_the_guard_leaves_accelerate_alone_once_deepspeed_is_imported(monkeypatch):
    import accelerate.utils.other as other

    before = other.is_deepspeed_available
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    with idle_engines.deepspeed_stays_unimported():
        assert other.is_deepspeed_available is before


def test_the_guard_is_reentrant_and_answers_true_once_deepspeed_gets_imported(monkeypatch):
    import accelerate.utils.other as other

    before = other.is_deepspeed_available
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    monkeypatch.setattr(other, "is_deepspeed_available", lambda: True)
    with idle_engines.deepspeed_stays_unimported():
        with idle_engines.deepspeed_stays_unimported():
            assert other.is_deepspeed_available() is False
        assert other.is_deepspeed_available() is False  # the inner block left the outer one's patch in place
        monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
        assert other.is_deepspeed_available() is True  # imported meanwhile: an engine may exist now
    assert other.is_deepspeed_available() is True and other.is_deepspeed_available is not before
