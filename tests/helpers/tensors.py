"""Snapshots of weights to compare: a model's state dict now, or the weights a run saved at its end."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every tensor of ``model``'s state dict (later steps do not change it)."""
    return {name: value.detach().clone() for name, value in model.state_dict().items()}


def final_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of ``folder/final.safetensors`` (what the jobs of the resume tests save when they end)."""
    from safetensors.torch import load_file

    return load_file(str(folder / "final.safetensors"))
