"""``torch_compile`` turns TF32 on where the GPU has it, as upstream's
``TrainingArguments.__post_init__`` (its TF32 step: ``enable_tf32(True)`` when ``tf32 is None and not fp16 or bf16``,
an explicit ``tf32`` applied over it). The CPU shows the decision with an Ampere GPU faked; the CUDA flags are
restored after each case."""

from __future__ import annotations

import pytest
import torch

from trainwell import TrainingArguments


@pytest.fixture
def ampere(monkeypatch):
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


def _tf32_after(tmp_path, **opts) -> tuple[bool, bool]:
    TrainingArguments(output_dir=str(tmp_path), report_to="none", **opts)
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.mark.parametrize("opts,expected", [
    ({"torch_compile": True}, True),
    ({"torch_compile_backend": "inductor"}, True),  # implies torch_compile, as upstream
    ({"torch_compile": True, "bf16": True}, True),
    ({"torch_compile": True, "fp16": True}, False),  # upstream leaves fp16 runs' float32 matmuls alone
    ({"torch_compile": True, "tf32": False}, False),  # an explicit tf32 wins
    ({}, False),  # without torch_compile nothing changes
], ids=["compile", "compile_backend", "compile_bf16", "compile_fp16", "compile_tf32_false", "no_compile"])
def test_torch_compile_turns_tf32_on_as_upstream(tmp_path, ampere, opts, expected):
    assert _tf32_after(tmp_path, **opts) == (expected, expected)


def test_no_tf32_without_an_ampere_gpu(tmp_path, monkeypatch):
    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        assert _tf32_after(tmp_path, torch_compile=True) == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags
