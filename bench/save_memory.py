"""Benchmark: peak host memory of ``save_model`` for a sharded model (ZeRO-3, FSDP2) against the model's size.

Runs ``tests/distributed/save_memory_job.py`` on 2 gloo ranks (CPU) for models of ``--layers`` square layers of
``--width`` (fp32; one layer of width 512 is 1 MiB) and prints, per backend and size, each rank's peak resident
memory above its level before the call, during ``trainer.save_model`` (streamed: one tensor gathered at a time, kept
by the writing rank only) and during a whole gather (``backend.full_state_dict()``: what every save did before, on
every rank under ZeRO-3). Resident memory is sampled every millisecond from ``/proc/self/statm`` with
``MALLOC_MMAP_THRESHOLD_`` fixed, so freed tensors leave resident memory at once (Linux only).

Usage::

    python bench/save_memory.py                       # 16, 32, 64 layers of width 512
    python bench/save_memory.py --layers 32 128 --width 1024
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "distributed" / "save_memory_job.py"
MIB = 2 ** 20


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(layers: int, width: int, scenarios: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as work:
        result = Path(work) / "result.json"
        env = {**os.environ, "DS_ACCELERATOR": "cpu", "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
               "--master_addr=127.0.0.1", f"--master_port={_free_port()}", str(JOB), str(result), work, str(layers), str(width),
               *scenarios]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--scenarios", nargs="+", default=["zero3", "fsdp"])
    ns = parser.parse_args()
    print(f"{'backend':8} {'model MiB':>9} {'layer MiB':>9} | {'save peak MiB (rank 0 / 1)':>26} | "
          f"{'whole gather MiB (rank 0 / 1)':>30}")
    for layers in ns.layers:
        results = run(layers, ns.width, ns.scenarios)
        for name in ns.scenarios:
            part = results[name]
            (s0, g0), (s1, g1) = part["peaks_by_rank"]
            print(f"{name:8} {part['model_bytes'] / MIB:9.1f} {part['layer_bytes'] / MIB:9.2f} | "
                  f"{s0 / MIB:12.1f} / {s1 / MIB:11.1f} | {g0 / MIB:14.1f} / {g1 / MIB:13.1f}")


if __name__ == "__main__":
    main()
