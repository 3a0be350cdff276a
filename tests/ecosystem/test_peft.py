"""PEFT (LoRA) models on trainwell's Trainer: adapter checkpoints resume exactly (from a path and with ``True``),
``load_best_model_at_end`` reloads the best adapter, checkpoints interchange with ``transformers.Trainer``, the
tokenizer of the data collator is saved, and a bitsandbytes-quantized model is refused where bitsandbytes cannot run.

The model is a two-layer Llama of a few thousand parameters built from ``LlamaConfig``: each run takes a second or
two on the CPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from peft import LoraConfig, get_peft_model  # noqa: E402

from trainwell import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

VOCAB, SEQ = 32, 8


def tiny_lora(seed: int = 0) -> torch.nn.Module:
    """A LoRA-wrapped two-layer Llama (dropout on, so that the random streams matter for an exact resume)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=SEQ)
    base = transformers.LlamaForCausalLM(config)
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["q_proj", "v_proj"],
                                           init_lora_weights=False))


class TokenRows(torch.utils.data.Dataset):
    """Random token rows whose labels are their inputs (a causal LM's loss)."""

    def __init__(self, n: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _args(out: Path, **kw: Any) -> TrainingArguments:
    base = dict(output_dir=str(out), per_device_train_batch_size=4, num_train_epochs=2, learning_rate=5e-2,
                save_strategy="steps", save_steps=3, logging_steps=1, report_to=[], disable_tqdm=True, seed=3,
                use_cpu=True)
    base.update(kw)
    return TrainingArguments(**base)


def _adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items() if "lora_" in k}


def _losses(trainer: Trainer) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}


class StopAt(TrainerCallback):
    """Stops training after ``step`` (the schedule stays the full run's: an interruption, not a shorter run)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.step:
            control.should_training_stop = True
        return control


def _train(out: Path, resume: Any = None, stop_at: int | None = None, **kw: Any) -> Trainer:
    callbacks = [StopAt(stop_at)] if stop_at is not None else None
    trainer = Trainer(model=tiny_lora(), args=_args(out, **kw), train_dataset=TokenRows(24, 1), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def full_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trainer]:
    out = tmp_path_factory.mktemp("peft_full")
    return out, _train(out)


def test_adapter_checkpoint_holds_the_adapter_only(full_run: tuple[Path, Trainer]) -> None:
    out, _ = full_run
    names = {p.name for p in (out / "checkpoint-3").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "data_state.json"} <= names
    assert "model.safetensors" not in names


@pytest.mark.parametrize("how", ["path", "true", "auto"])
def test_resume_of_an_adapter_checkpoint_is_exact(full_run: tuple[Path, Trainer], tmp_path: Path,
                                                  how: str) -> None:
    """``auto`` is what ``trainwell train --resume_from_checkpoint auto`` hands the Trainer."""
    out, full = full_run
    _train(tmp_path, stop_at=3)  # interrupted after the first checkpoint
    resume = {"path": str(tmp_path / "checkpoint-3"), "true": True, "auto": "auto"}[how]
    resumed = _train(tmp_path, resume=resume)
    want, got = _adapter(full.model), _adapter(resumed.model)
    assert want.keys() == got.keys() and want
    assert max((want[k] - got[k]).abs().max().item() for k in want) == 0.0
    assert {s: l for s, l in _losses(resumed).items() if s > 3} == {s: l for s, l in _losses(full).items() if s > 3}
    assert resumed.state.global_step == full.state.global_step == 12


def test_load_best_model_at_end_reloads_the_best_adapter(tmp_path: Path) -> None:
    trainer = Trainer(model=tiny_lora(), args=_args(tmp_path, eval_strategy="steps", eval_steps=3,
                                                    load_best_model_at_end=True, metric_for_best_model="loss",
                                                    greater_is_better=True),  # the worst loss: not the last
                      train_dataset=TokenRows(24, 1), eval_dataset=TokenRows(8, 2))
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and not best.endswith("checkpoint-12")
    from safetensors.torch import load_file

    saved = load_file(str(Path(best) / "adapter_model.safetensors"))
    loaded = _adapter(trainer.model)
    for name, tensor in saved.items():
        match = [k for k in loaded if k.replace(".default", "") == name]
        assert match and torch.equal(loaded[match[0]], tensor), name


def test_tokenizer_of_the_data_collator_is_saved(tmp_path: Path) -> None:
    class Tokenizer:
        """What save_model needs of a tokenizer."""

        def save_pretrained(self, folder: str) -> None:
            Path(folder, "tokenizer_config.json").write_text(json.dumps({"from": "collator"}))

    class Collator:
        tokenizer = Tokenizer()

        def __call__(self, rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
            return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}

    trainer = Trainer(model=tiny_lora(), args=_args(tmp_path, max_steps=3), data_collator=Collator(),
                      train_dataset=TokenRows(24, 1))
    assert trainer.processing_class is None
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    for folder in (tmp_path / "final", tmp_path / "checkpoint-3"):
        assert json.loads((folder / "tokenizer_config.json").read_text()) == {"from": "collator"}


def test_quantized_model_is_refused_without_bitsandbytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # a machine where bitsandbytes cannot be imported
    from peft import prepare_model_for_kbit_training

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    base = prepare_model_for_kbit_training(transformers.LlamaForCausalLM(config), use_gradient_checkpointing=False)
    base.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=BitsAndBytesConfig(...)) sets
    model = get_peft_model(base, LoraConfig(r=2, target_modules=["q_proj"]))
    with pytest.raises(ValueError, match="bitsandbytes cannot run here.*pip install bitsandbytes"):
        Trainer(model=model, args=_args(tmp_path), train_dataset=TokenRows(8, 1))


@pytest.mark.slow
def test_upstream_trainer_resumes_a_trainwell_adapter_checkpoint(full_run: tuple[Path, Trainer],
                                                                 tmp_path: Path) -> None:
    """transformers.Trainer continues from trainwell's checkpoint-3 to the same adapter as trainwell's full run."""
    out, full = full_run
    _train(tmp_path, stop_at=3)
    theirs = transformers.Trainer(model=tiny_lora(), args=transformers.TrainingArguments(
        output_dir=str(tmp_path / "upstream"), per_device_train_batch_size=4, num_train_epochs=2, learning_rate=5e-2,
        save_strategy="no", logging_steps=1, report_to=[], disable_tqdm=True, seed=3, use_cpu=True),
        train_dataset=TokenRows(24, 1))
    theirs.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    want, got = _adapter(full.model), _adapter(theirs.model)
    assert max((want[k] - got[k]).abs().max().item() for k in want) < 1e-5
