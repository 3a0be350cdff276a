"""DDP scaling on the CPU: optimizer steps per second of 1 vs 2 processes (gloo) on the same global batch.

    python bench/ddp_scaling.py [--steps 60] [--global-batch 64] [--hidden 512] [--find-unused auto|true|false]

Launches this file twice under ``torch.distributed.run`` (``--nproc_per_node=1``, then ``2``; one thread per
process), trains an MLP with the Trainer for ``--steps`` optimizer steps, and times the steps after a warm-up of 5
(process start-up, the first all-reduce and DDP's bucket rebuilding excluded). Prints both rates and their ratio;
with perfect scaling the ratio approaches 2 (each process computes half the batch), communication pulls it down.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 5


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--find-unused", choices=["auto", "true", "false"], default="auto",
                        help="ddp_find_unused_parameters (auto: unset, trainwell's default)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def worker(opts: argparse.Namespace) -> None:
    """One rank: train ``opts.steps`` steps; rank 0 prints ``RESULT {json}``."""
    import torch
    from torch import nn

    from trainwell import Trainer, TrainerCallback, TrainingArguments

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))

    class Timer(TrainerCallback):
        """Wall-clock time at the end of every optimizer step."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter())

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(64, opts.hidden), nn.GELU(), nn.Linear(opts.hidden, opts.hidden),
                                     nn.GELU(), nn.Linear(opts.hidden, 1))

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return {"loss": nn.functional.mse_loss(self.net(x).sum(-1), labels)}

    g = torch.Generator().manual_seed(0)
    n = opts.global_batch * opts.steps
    x, y = torch.randn(n, 64, generator=g), torch.randn(n, generator=g)
    data = [{"x": x[i], "labels": y[i]} for i in range(n)]
    timer = Timer()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, per_device_train_batch_size=opts.global_batch // world,
                                 max_steps=opts.steps, save_strategy="no", report_to=[], disable_tqdm=True,
                                 logging_strategy="no", use_cpu=True, dataloader_drop_last=True,
                                 ddp_find_unused_parameters=None if opts.find_unused == "auto"
                                 else opts.find_unused == "true")
        Trainer(model=MLP(), args=args, train_dataset=data, callbacks=[timer]).train()
    timed = timer.times[WARMUP - 1:]
    rate = (len(timed) - 1) / (timed[-1] - timed[0])
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps({"world": world, "steps_per_s": rate}), flush=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(nproc: int, opts: argparse.Namespace) -> float:
    """Run the worker on ``nproc`` processes; returns rank 0's steps per second."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--master_addr=127.0.0.1",
           f"--master_port={_free_port()}", __file__, "--worker", f"--steps={opts.steps}",
           f"--global-batch={opts.global_batch}", f"--hidden={opts.hidden}", f"--find-unused={opts.find_unused}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    for line in done.stdout.splitlines():
        if "RESULT " in line:
            return float(json.loads(line.split("RESULT ", 1)[1])["steps_per_s"])
    raise RuntimeError(f"the {nproc}-process run printed no result (exit code {done.returncode}):\n"
                       f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> None:
    """Run 1 then 2 processes and print the rates and their ratio."""
    opts = _parse(sys.argv[1:] if argv is None else argv)
    if opts.global_batch % 2:
        raise SystemExit(f"--global-batch={opts.global_batch} must be even (split over 2 processes)")
    if opts.steps <= WARMUP + 1:
        raise SystemExit(f"--steps={opts.steps} must exceed the {WARMUP} warm-up steps by at least 2")
    if opts.worker:
        worker(opts)
        return
    one = launch(1, opts)
    two = launch(2, opts)
    print(f"global batch {opts.global_batch}, MLP hidden {opts.hidden}, {opts.steps} steps (first {WARMUP} "
          f"not timed), {os.cpu_count()} CPU cores")
    print(f"1 process : {one:8.2f} steps/s")
    print(f"2 processes: {two:8.2f} steps/s")
    print(f"ratio 2/1 : {two / one:8.2f}")


if __name__ == "__main__":
    main()
