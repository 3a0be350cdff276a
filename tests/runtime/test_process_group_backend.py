"""The backend string of the process group: on CUDA, ``nccl`` comes with ``gloo`` for CPU tensors (accelerate's
``cuda:nccl,cpu:gloo``), so FSDP ``offload`` (CPU shards) has a backend for its CPU collectives."""

from __future__ import annotations

import torch

from trainwell.runtime.distributed import process_group_backend


def test_cuda_gets_nccl_with_gloo_for_cpu_tensors() -> None:
    assert process_group_backend(torch.device("cuda", 0)) == "cuda:nccl,cpu:gloo"
    assert process_group_backend(torch.device("cuda", 1), "nccl") == "cuda:nccl,cpu:gloo"  # ddp_backend="nccl"


def test_cpu_and_explicit_backends_are_kept() -> None:
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("cuda", 0), "gloo") == "gloo"
    assert process_group_backend(torch.device("cpu"), "mpi") == "mpi"
