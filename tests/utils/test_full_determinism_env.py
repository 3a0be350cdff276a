"""``full_determinism`` sets the environment upstream's ``enable_full_determinism`` sets
(``FLASH_ATTENTION_DETERMINISTIC=1`` for flash-attention's deterministic backward, the CUDA and Ascend variables)."""

from __future__ import annotations

import os

import pytest
import torch

from trainwell.utils.seeding import enable_full_determinism

NAMES = ("CUDA_LAUNCH_BLOCKING", "CUBLAS_WORKSPACE_CONFIG", "ASCEND_LAUNCH_BLOCKING", "HCCL_DETERMINISTIC",
         "FLASH_ATTENTION_DETERMINISTIC")


@pytest.fixture
def clean_env(monkeypatch):
    for name in NAMES:  # restored after the test
        monkeypatch.delenv(name, raising=False)
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield monkeypatch
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def _set_by(fn) -> dict[str, str]:
    for name in NAMES:
        os.environ.pop(name, None)
    fn(0)
    return {name: os.environ[name] for name in NAMES if name in os.environ}


def test_full_determinism_sets_upstreams_environment(clean_env):
    ours = _set_by(enable_full_determinism)
    assert ours["FLASH_ATTENTION_DETERMINISTIC"] == "1"
    transformers_utils = pytest.importorskip("transformers.trainer_utils")
    assert ours == _set_by(transformers_utils.enable_full_determinism)
    assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
