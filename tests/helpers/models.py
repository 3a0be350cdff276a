"""Tiny models shared by the tests: each returns a loss the Trainer can use (all CPU, all milliseconds)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F


class RegressionModel(nn.Module):
    """``y = w.x + b`` with a mean squared error; returns ``{"loss", "logits"}`` (loss None without labels)."""

    def __init__(self, dim: int = 2) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        """Prediction and, with labels, the MSE loss."""
        pred = self.linear(x).squeeze(-1)
        loss = F.mse_loss(pred, labels) if labels is not None else None
        return {"loss": loss, "logits": pred}


class ClassifierModel(nn.Module):
    """A linear 3-class classifier shaped like a transformers model (``config.num_labels``, ``device``)."""

    def __init__(self, dim: int = 4, num_labels: int = 3) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_labels=num_labels)
        self.linear = nn.Linear(dim, num_labels)

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.linear.weight.device

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        """Logits and, with labels, the (unweighted) cross entropy."""
        logits = self.linear(features)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class TokenLM(nn.Module):
    """Embedding + linear LM; the loss is a token mean over labels that are not -100.

    With ``num_items_in_batch`` (the tokens of the whole optimizer step) it returns sum / num_items_in_batch, as
    upstream models do, so gradient accumulation is exact.
    """

    def __init__(self, vocab: int = 11, dim: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                num_items_in_batch: torch.Tensor | int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, logits)."""
        logits = self.head(self.embed(input_ids))
        flat = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                               reduction="sum")
        denominator = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()
        return flat / denominator, logits


class TokenLMNoKwargs(TokenLM):
    """The same LM whose forward does not take ``num_items_in_batch`` (a plain per-batch token mean)."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, logits)."""
        return super().forward(input_ids, labels)


class BlockStack(nn.Module):
    """An input layer, an ``nn.ModuleList`` of tanh blocks and an MSE head (for gradient checkpointing)."""

    def __init__(self, dim: int = 4, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(2, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) for _ in range(depth))
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        """MSE of the stack's prediction."""
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        pred = self.out(h).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels), "logits": pred}


class SeededRegressor(nn.Module):
    """``y = w.x + b`` (``Linear(dim, 1)``) initialised under ``torch.manual_seed(0)``, so that two runs (trainwell
    and upstream) start from the same weights; returns ``{"logits"}`` and, with labels, ``"loss"`` (the MSE)."""

    def __init__(self, dim: int = 3) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """The prediction and, with labels, its mean squared error."""
        pred = self.linear(x).squeeze(-1)
        out = {"logits": pred}
        if labels is not None:
            out["loss"] = F.mse_loss(pred, labels)
        return out
