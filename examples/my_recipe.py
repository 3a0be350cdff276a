"""An example user recipe for ``trainwell train examples/recipe.yaml``: an MLP digit classifier.

It uses scikit-learn's 8x8 digits (1,797 images, shipped inside scikit-learn) when scikit-learn is installed,
and otherwise a synthetic 10-class problem of the same shape, so it runs anywhere. Every function here is a
factory named by import path in ``recipe.yaml``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset


class DigitsMLP(nn.Module):
    """``in_features -> hidden -> hidden -> num_classes`` with ReLU; returns ``{"loss", "logits"}``."""

    def __init__(self, in_features: int = 64, hidden: int = 128, num_classes: int = 10, dropout: float = 0.1) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
        )

    def forward(self, pixels: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(pixels)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class ArrayDataset(Dataset):
    """Rows of a feature matrix with their labels, as ``{"pixels", "labels"}`` items."""

    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        self.features = torch.as_tensor(features, dtype=torch.float32)
        self.labels = torch.as_tensor(labels, dtype=torch.long)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"pixels": self.features[index], "labels": self.labels[index]}


def _load_features(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Digits scaled to [0, 1] when scikit-learn is installed, else Gaussian clusters of the same shape."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        rng = np.random.default_rng(seed)
        centers = rng.normal(size=(10, 64))
        labels = rng.integers(0, 10, size=1797)
        return (centers[labels] + rng.normal(scale=1.5, size=(1797, 64))).astype(np.float32), labels
    digits = load_digits()
    return (digits.data / 16.0).astype(np.float32), digits.target


def build_model(hidden: int = 128, dropout: float = 0.1) -> DigitsMLP:
    """The classifier (64 inputs, 10 classes)."""
    return DigitsMLP(hidden=hidden, dropout=dropout)


def build_datasets(eval_fraction: float = 0.2, seed: int = 0) -> tuple[ArrayDataset, ArrayDataset]:
    """``(train, eval)``: a fixed random split of the data (``seed`` only picks the split)."""
    features, labels = _load_features(seed)
    order = np.random.default_rng(seed).permutation(len(labels))
    n_eval = int(len(labels) * eval_fraction)
    test, train = order[:n_eval], order[n_eval:]
    return ArrayDataset(features[train], labels[train]), ArrayDataset(features[test], labels[test])


def compute_metrics(eval_pred: Any) -> dict[str, float]:
    """Accuracy of the arg-max prediction."""
    logits, labels = eval_pred.predictions, eval_pred.label_ids
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}
