"""Arguments that used to be stored and never read, now doing what upstream documents."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from trainwell import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments
from trainwell.data.samplers import LengthGroupedSampler
from trainwell.loops.train_hooks import EmptyCacheCallback


class TokenModel(nn.Module):
    """A tiny language-model-shaped module with get_input_embeddings()."""

    main_input_name = "input_ids"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(11, 6)
        self.head = nn.Linear(6, 1)
        self.seen: list[torch.Tensor] = []

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        hidden = self.embed(input_ids)
        self.seen.append(hidden.detach().clone())
        out = self.head(hidden).mean(dim=(1, 2))
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 12, length: int = 5) -> None:
        self.n, self.length = n, length

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 11, (self.length,), generator=g), "labels": torch.tensor(float(i % 3))}


def _args(tmp_path, **kw) -> TrainingArguments:
    base = dict(per_device_train_batch_size=4, report_to="none", use_cpu=True, save_strategy="no",
                disable_tqdm=True, learning_rate=1e-2)
    return TrainingArguments(str(tmp_path), **{**base, **kw})


# ------------------------------------------------------------------------------------------------- neftune
def test_neftune_noise_in_training_only_bounded_and_removed(tmp_path) -> None:
    alpha = 5.0
    model = TokenModel()
    trainer = Trainer(model=model, args=_args(tmp_path, neftune_noise_alpha=alpha, max_steps=2),
                      train_dataset=Tokens(), eval_dataset=Tokens(n=4))
    batch = Tokens()[0]["input_ids"][None]
    trainer.train()
    bound = alpha / math.sqrt(5 * 6)
    # the training forwards saw embeddings + uniform noise in [-bound, bound] (the weights moved in between, so
    # check against the clean embedding of the same batch recomputed with the weights of that step)
    assert len(model.seen) == 2
    assert not any(m._forward_hooks for m in model.modules())  # removed after train()
    assert not hasattr(model.embed, "neftune_noise_alpha")
    model.seen.clear()
    model.eval()
    clean = model.embed(batch)
    torch.testing.assert_close(model(batch, labels=torch.zeros(1))["logits"], model.head(clean).mean(dim=(1, 2)))

    # during training: the noise is there and bounded
    from trainwell.loops import train_hooks

    hooks = train_hooks.attach(trainer.args, trainer.model, trainer.callback_handler)
    try:
        model.train()
        noisy = model.embed(batch)
        assert 0 < (noisy - clean).abs().max().item() <= bound + 1e-6
        model.eval()
        torch.testing.assert_close(model.embed(batch), clean)  # evaluation: no noise
    finally:
        hooks.detach()


def test_neftune_noise_is_upstreams() -> None:
    """Same generator state, same noise as transformers' NEFTune hook (the loop's RNG use differs, not the noise)."""
    pytest.importorskip("transformers")
    from transformers.integrations.neftune import neftune_post_forward_hook as upstream_hook

    from trainwell.loops.train_hooks import neftune_post_forward_hook

    embed = nn.Embedding(11, 6)
    embed.neftune_noise_alpha = 5.0
    output = embed(torch.randint(0, 11, (3, 5)))
    torch.manual_seed(7)
    ours = neftune_post_forward_hook(embed, (), output)
    torch.manual_seed(7)
    theirs = upstream_hook(embed, (), output)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    embed.eval()
    assert neftune_post_forward_hook(embed, (), output) is output


def test_neftune_needs_input_embeddings(tmp_path) -> None:
    class NoEmbeddings(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(5, 1)

        def forward(self, input_ids, labels=None):
            return {"loss": self.lin(input_ids.float()).mean()}

    trainer = Trainer(model=NoEmbeddings(), args=_args(tmp_path, neftune_noise_alpha=1.0, max_steps=1),
                      train_dataset=Tokens())
    with pytest.raises(ValueError, match="neftune_noise_alpha needs a model whose get_input_embeddings"):
        trainer.train()


# --------------------------------------------------------------------------------- include_tokens_per_second
def test_include_tokens_per_second_counts_the_tokens_trained(tmp_path) -> None:
    trainer = Trainer(model=TokenModel(), args=_args(tmp_path, include_tokens_per_second=True, num_train_epochs=2),
                      train_dataset=Tokens(n=10, length=5))
    metrics = trainer.train().metrics
    tokens = 10 * 5 * 2
    # train_runtime is rounded to 0.1 ms: allow for that
    assert math.isclose(metrics["train_tokens_per_second"] * metrics["train_runtime"], tokens,
                        rel_tol=0.05, abs_tol=1e-4 * metrics["train_tokens_per_second"])
    assert trainer.state.num_input_tokens_seen == 0  # that one is include_num_input_tokens_seen's
    plain = Trainer(model=TokenModel(), args=_args(tmp_path / "b", max_steps=1), train_dataset=Tokens())
    assert "train_tokens_per_second" not in plain.train().metrics


# ------------------------------------------------------------------------------------- torch_empty_cache_steps
def test_torch_empty_cache_steps_runs_every_n_steps(tmp_path, monkeypatch) -> None:
    calls: list[int] = []
    trainer = Trainer(model=TokenModel(), args=_args(tmp_path, torch_empty_cache_steps=2, max_steps=5),
                      train_dataset=Tokens())
    original = EmptyCacheCallback.on_step_end

    def spy(self, args, state, control, **kwargs):
        before = self.calls
        original(self, args, state, control, **kwargs)
        if self.calls > before:
            calls.append(state.global_step)

    monkeypatch.setattr(EmptyCacheCallback, "on_step_end", spy)
    trainer.train()
    assert calls == [2, 4]
    assert not any(isinstance(cb, EmptyCacheCallback) for cb in trainer.callback_handler.callbacks)


# ----------------------------------------------------------------------------------------- accelerator_config
def test_accelerator_config_values_trainwell_honours_and_the_others(tmp_path) -> None:
    ok = TrainingArguments(str(tmp_path), accelerator_config={"split_batches": False, "even_batches": True,
                                                              "use_seedable_sampler": True, "non_blocking": True})
    assert ok.accelerator_config["non_blocking"] is True
    for key, value in (("split_batches", True), ("dispatch_batches", True), ("even_batches", False),
                       ("use_seedable_sampler", False)):
        with pytest.raises(NotImplementedError, match=f"accelerator_config {key}={value} is not supported"):
            TrainingArguments(str(tmp_path), accelerator_config={key: value})
    with pytest.raises(ValueError, match="unknown key 'split_batch'"):
        TrainingArguments(str(tmp_path), accelerator_config={"split_batch": True})


# ------------------------------------------------------------------------------------------------- Seq2Seq
class Generator(TokenModel):
    def generate(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        length = kwargs.get("max_length") or self.generation_config.max_length
        return torch.full((input_ids.shape[0], length), 3, dtype=torch.long)


def test_seq2seq_generation_config_from_a_folder_like_upstream(tmp_path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "gen"
    folder.mkdir()
    (folder / "generation_config.json").write_text(json.dumps({"max_length": 7, "num_beams": 1}))
    model = Generator()
    args = Seq2SeqTrainingArguments(str(tmp_path / "out"), generation_config=str(folder), predict_with_generate=True,
                                    report_to="none", use_cpu=True, per_device_eval_batch_size=4)
    trainer = Seq2SeqTrainer(model=model, args=args)
    assert isinstance(model.generation_config, transformers.GenerationConfig)
    assert model.generation_config.to_dict() == transformers.Seq2SeqTrainer.load_generation_config(
        str(folder)).to_dict()
    predictions = trainer.predict(Tokens(n=6)).predictions
    assert predictions.shape == (6, 7)  # generate used the loaded config's max_length
    with pytest.raises(FileNotFoundError, match="no generation_config.json"):
        Seq2SeqTrainer(model=Generator(), args=Seq2SeqTrainingArguments(
            str(tmp_path / "o2"), generation_config=str(tmp_path / "missing"), report_to="none", use_cpu=True))


def test_sortish_sampler_groups_by_length(tmp_path) -> None:
    args = Seq2SeqTrainingArguments(str(tmp_path), sortish_sampler=True, report_to="none", use_cpu=True)
    trainer = Seq2SeqTrainer(model=TokenModel(), args=args, train_dataset=Tokens())
    assert isinstance(trainer._get_train_sampler(), LengthGroupedSampler)
    plain = Seq2SeqTrainer(model=TokenModel(), args=Seq2SeqTrainingArguments(str(tmp_path), report_to="none",
                                                                             use_cpu=True), train_dataset=Tokens())
    assert not isinstance(plain._get_train_sampler(), LengthGroupedSampler)
