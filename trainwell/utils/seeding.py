"""Seeding python, numpy and torch: ``set_seed``, ``enable_full_determinism`` and the DataLoader workers' seed.

numpy and torch are imported inside the functions so that importing this module (and ``trainwell``) stays light.
"""

from __future__ import annotations

import os
import random


def set_seed(seed: int, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (CPU and every CUDA device); optionally turn on deterministic algorithms."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        enable_full_determinism(seed, warn_only=True)


def enable_full_determinism(seed: int, warn_only: bool = False) -> None:
    """Seed everything and ask torch for deterministic kernels (slower; for debugging distributed runs)."""
    import torch

    set_seed(seed)
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":16:8"
    # as upstream's enable_full_determinism (transformers/trainer_utils.py): Ascend NPUs' deterministic mode and
    # flash-attention's deterministic backward (read by the flash_attn kernels transformers calls)
    os.environ["ASCEND_LAUNCH_BLOCKING"] = "1"
    os.environ["HCCL_DETERMINISTIC"] = "1"
    os.environ["FLASH_ATTENTION_DETERMINISTIC"] = "1"
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def seed_worker(worker_id: int, num_workers: int = 0, rank: int = 0) -> None:
    """DataLoader ``worker_init_fn`` of the training loader (upstream's): seed python, numpy and torch in the worker
    with ``num_workers * rank`` plus torch's per-worker seed, so that the ranks' workers draw different numbers."""
    import torch

    set_seed(num_workers * rank + torch.initial_seed() % 2**32)
