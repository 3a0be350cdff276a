"""The built-in default recipe: a tiny character-level transformer language model.

It needs no download and no extra package: the training text is the documentation strings of a fixed,
sorted list of Python standard-library modules (``inspect.getdoc`` over each module and its public members),
so it exists on every machine that has Python. The docstrings differ a little between Python versions, so
the data is deterministic for a given interpreter, not across interpreters.

Factories (used by ``trainwell train`` and usable from Python):

* :func:`build_datasets` -> ``(train_dataset, eval_dataset, vocab)``: fixed-length character chunks as
  map-style datasets of ``{"input_ids", "labels"}`` (``LongTensor``), split deterministically.
* :func:`build_model` -> :class:`CharTransformerLM`, whose ``forward(input_ids, labels=None,
  num_items_in_batch=None)`` returns ``{"loss", "logits"}``.
* :func:`generate` -> a sampled continuation of a prompt, for the run summary.

The labels are already shifted (``labels[t]`` is the character after ``input_ids[t]``), so the number of
label tokens the trainer counts for ``num_items_in_batch`` is exactly the number of predicted tokens.
"""

from __future__ import annotations

import importlib
import inspect
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

#: Standard-library modules whose docstrings make up the corpus (sorted, for determinism).
STDLIB_MODULES: tuple[str, ...] = tuple(
    sorted(
        [
            "abc", "argparse", "bisect", "builtins", "collections", "contextlib", "copy", "csv",
            "dataclasses", "datetime", "decimal", "enum", "fractions", "functools", "heapq",
            "itertools", "json", "logging", "math", "operator", "os", "pathlib", "pprint",
            "random", "re", "shutil", "statistics", "string", "textwrap", "typing",
        ]
    )
)
IGNORE_INDEX = -100
UNKNOWN_CHAR = "?"


# ----------------------------------------------------------------------------------------------- text


def _docstrings_of(module_name: str) -> Iterable[str]:
    """The docstring of a module and of each of its public members, in sorted member order."""
    module = importlib.import_module(module_name)
    doc = inspect.getdoc(module)
    if doc:
        yield doc
    for name in sorted(dir(module)):
        if name.startswith("_"):
            continue
        try:
            member = getattr(module, name)
        except Exception:  # some platform-specific attributes raise on access
            continue
        doc = inspect.getdoc(member)
        if doc:
            yield doc


def stdlib_docstring_text(modules: Iterable[str] = STDLIB_MODULES, max_chars: int | None = None) -> str:
    """Concatenate the unique docstrings of ``modules`` (first occurrence kept), separated by blank lines.

    Characters outside printable ASCII are replaced by ``"?"`` so the vocabulary stays small and stable.
    """
    seen: set[str] = set()
    parts: list[str] = []
    with warnings.catch_warnings():  # touching deprecated members (typing.io, ...) warns
        warnings.simplefilter("ignore")
        for module_name in modules:
            for doc in _docstrings_of(module_name):
                if doc not in seen:  # re-exported members share docstrings; keep one copy
                    seen.add(doc)
                    parts.append(doc)
    text = "\n\n".join(parts)
    text = "".join(c if (c == "\n" or 32 <= ord(c) < 127) else UNKNOWN_CHAR for c in text)
    return text[:max_chars] if max_chars else text


@dataclass(frozen=True)
class CharVocab:
    """A character vocabulary: ``chars[i]`` is the character of id ``i``."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> CharVocab:
        """The sorted set of characters of ``text`` (always including the unknown character)."""
        return cls("".join(sorted(set(text) | {UNKNOWN_CHAR})))

    @property
    def size(self) -> int:
        """Number of characters (the model's ``vocab_size``)."""
        return len(self.chars)

    def __len__(self) -> int:
        return self.size

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text``; unknown characters map to ``"?"``."""
        index = {c: i for i, c in enumerate(self.chars)}
        unknown = index[UNKNOWN_CHAR]
        return [index.get(c, unknown) for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of a sequence of ids."""
        return "".join(self.chars[int(i)] for i in ids)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write ``vocab.json`` into ``folder`` (so a checkpoint can be decoded later)."""
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "vocab.json").write_text(json.dumps({"chars": self.chars}))

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> CharVocab:
        """Read the ``vocab.json`` written by :meth:`save_pretrained`."""
        return cls(json.loads((Path(folder) / "vocab.json").read_text())["chars"])


class CharChunkDataset(Dataset):
    """Fixed-length chunks of a token sequence: item ``i`` is ``{"input_ids", "labels"}`` of length ``block_size``."""

    def __init__(self, ids: torch.Tensor, starts: list[int], block_size: int) -> None:
        self.ids = ids
        self.starts = starts
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = self.starts[index]
        window = self.ids[start : start + self.block_size + 1]
        return {"input_ids": window[:-1].clone(), "labels": window[1:].clone()}


def build_datasets(
    block_size: int = 64,
    eval_every: int = 10,
    max_eval_samples: int | None = 256,
    max_chars: int | None = None,
    modules: Iterable[str] = STDLIB_MODULES,
) -> tuple[CharChunkDataset, CharChunkDataset, CharVocab]:
    """Build ``(train_dataset, eval_dataset, vocab)`` from the standard-library docstrings.

    The text is cut into non-overlapping chunks of ``block_size + 1`` characters; every ``eval_every``-th
    chunk goes to the evaluation set (capped at ``max_eval_samples``, taken evenly), the rest to training.
    """
    if block_size < 1 or eval_every < 2:
        raise ValueError(f"build_datasets: need block_size >= 1 and eval_every >= 2, got {block_size}, {eval_every}")
    text = stdlib_docstring_text(modules, max_chars=max_chars)
    vocab = CharVocab.from_text(text)
    ids = torch.tensor(vocab.encode(text), dtype=torch.long)
    starts = list(range(0, len(ids) - block_size - 1, block_size + 1))
    if len(starts) < eval_every:
        raise ValueError(f"build_datasets: the text ({len(ids)} chars) is too short for block_size={block_size}")
    eval_starts = starts[eval_every - 1 :: eval_every]
    train_starts = [s for i, s in enumerate(starts) if (i + 1) % eval_every]
    if max_eval_samples and len(eval_starts) > max_eval_samples:
        stride = len(eval_starts) / max_eval_samples
        eval_starts = [eval_starts[int(i * stride)] for i in range(max_eval_samples)]
    return CharChunkDataset(ids, train_starts, block_size), CharChunkDataset(ids, eval_starts, block_size), vocab


# ---------------------------------------------------------------------------------------------- model


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a causal mask (each position sees itself and the past)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, length, self.n_heads, dim // self.n_heads).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, length, dim))


class Block(nn.Module):
    """A pre-norm transformer block: attention then MLP, each with a residual connection."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharTransformerLM(nn.Module):
    """A small GPT-style character language model (token + learned position embeddings, tied output layer)."""

    def __init__(
        self, vocab_size: int, d_model: int = 96, n_layers: int = 2, n_heads: int = 4,
        block_size: int = 64, dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.config = {"vocab_size": vocab_size, "d_model": d_model, "n_layers": n_layers,
                       "n_heads": n_heads, "block_size": block_size, "dropout": dropout}
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, num_items_in_batch: Any = None
    ) -> dict[str, torch.Tensor]:
        """Logits for every position; with ``labels`` (already shifted, -100 ignored) also the loss.

        The loss is the mean cross entropy over label tokens, or, when ``num_items_in_batch`` is given,
        the summed cross entropy divided by it (so gradient accumulation over micro-batches is exact).
        """
        length = input_ids.shape[1]
        if length > self.block_size:
            raise ValueError(f"input length {length} exceeds the model's block_size {self.block_size}")
        pos = torch.arange(length, device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if labels is None:
            return {"logits": logits}
        flat_logits, flat_labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
        if num_items_in_batch is None:
            loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX)
        else:
            loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=IGNORE_INDEX, reduction="sum")
            loss = loss / num_items_in_batch
        return {"loss": loss, "logits": logits}


def build_model(
    vocab_size: int, d_model: int = 96, n_layers: int = 2, n_heads: int = 4, block_size: int = 64,
    dropout: float = 0.0,
) -> CharTransformerLM:
    """A fresh :class:`CharTransformerLM` (its initial weights follow the current torch seed)."""
    return CharTransformerLM(vocab_size, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                             block_size=block_size, dropout=dropout)


@torch.no_grad()
def generate(
    model: CharTransformerLM, vocab: CharVocab, prompt: str, n: int = 80, *,
    temperature: float = 0.8, seed: int = 0,
) -> str:
    """Sample ``n`` characters after ``prompt`` (deterministic for a given ``seed``); returns only the new text."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(seed)
    ids = vocab.encode(prompt) or vocab.encode("\n")
    for _ in range(n):
        context = torch.tensor([ids[-model.block_size :]], dtype=torch.long, device=device)
        logits = model(context)["logits"][0, -1].float().cpu() / max(temperature, 1e-6)
        ids.append(int(torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)))
    model.train(was_training)
    return vocab.decode(ids[len(vocab.encode(prompt)) :] if prompt else ids[1:])


def perplexity(loss: float | None) -> float | None:
    """``exp(loss)``, or None without a loss (inf when it overflows)."""
    if loss is None:
        return None
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")
