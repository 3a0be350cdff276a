"""Tiny deterministic datasets shared by the tests (lists of dicts, each built from a seeded generator)."""

from __future__ import annotations

import torch


def regression_data(n: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` items ``{"x": (2,), "labels": ()}`` of ``y = x0 - 2 x1 + 0.5`` plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = x @ torch.tensor([1.0, -2.0]) + 0.5 + 0.1 * torch.randn(n, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def classification_data(n: int = 48, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` items ``{"features": (4,), "labels": int}``; the class is the argmax of the first 3 features."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, 4, generator=g)
    labels = feats[:, :3].argmax(-1)
    return [{"features": feats[i], "labels": labels[i]} for i in range(n)]


def token_data(n: int = 64, seq: int = 6, vocab: int = 11, seed: int = 0,
               masked: bool = True) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of ``input_ids``/``labels``; with ``masked``, row i has ``i % seq`` labels set to -100."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    labels = torch.randint(0, vocab, (n, seq), generator=g)
    if masked:
        for i in range(n):
            labels[i, : i % seq] = -100
    return [{"input_ids": ids[i], "labels": labels[i]} for i in range(n)]


class NormalRows(torch.utils.data.Dataset):
    """``n`` rows ``{"x": (3,), "labels": ()}``, all standard normal draws of a generator seeded with 0 (features
    first, then labels: no relation to learn, only numbers two runs must agree on)."""

    def __init__(self, n: int = 12) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 3, generator=g), torch.randn(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}
