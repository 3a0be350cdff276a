"""Benchmark: checkpoint save/load through trainwell's CheckpointManager vs a bare ``torch.save``/``torch.load``.

The state is a stack of ``Linear(hidden, hidden)`` layers (about ``--params`` parameters, fp32) plus its AdamW state
after one step, a linear schedule and the RNG states. trainwell writes a ``checkpoint-<step>`` folder
(``model.safetensors``, ``optimizer.pt``, ``scheduler.pt``, ``rng_state.pth``, json files), fsyncs every file,
writes the completion marker and renames the folder into place; loading verifies the marker's file list, checks
the safetensors header, matches keys and shapes, then applies. The baseline saves the same state dicts in one
``torch.save`` file, with and without an ``fsync`` (trainwell always fsyncs), and loads it with
``torch.load(weights_only=True)`` + ``load_state_dict``. Files are read back from the page cache (no cache drop).

The cost of the checksums is measured in the same run: the save with checksums (hashed while written, the default)
and with the hash replaced by a no-op; the load with verification (every file's size and checksum, plus the pickle
allow-list scan) and without (``load(verify=False)``).

Blocking time (how long training stops for a save), same run: trainwell's synchronous save, trainwell's
``async_save`` (the copy to host memory; the first save allocates the reused host buffers, later ones reuse them)
and the upstream ``transformers.Trainer._save_checkpoint`` of the same model, optimizer and scheduler (upstream
writes without fsync). ``--no-upstream`` skips the upstream part.

Several processes (launched with ``torchrun --nproc_per_node=N``, gloo): every rank holds the same state (DDP) and
only the blocking time is measured: a synchronous save (rank 0 writes the shared files, every rank its RNG file,
the commit's collectives on the training group) against ``async_save`` (the copy to host memory; the commit on the
saver's own gloo group in a background thread), the slowest rank's time per save.

Usage::

    python bench/checkpoint.py                  # ~100M parameters (0.4 GB of weights, 1.2 GB with AdamW)
    python bench/checkpoint.py --params 5e6 --repeats 2
    torchrun --nproc_per_node=2 bench/checkpoint.py --params 5e7 --repeats 3   # blocking time on 2 ranks
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainwell.checkpoint.manager import CheckpointContents, CheckpointManager
from trainwell.checkpoint.rng import capture_rng_state, restore_rng_state
from trainwell.optim.schedules import get_linear_schedule_with_warmup


def build_state(params: int, hidden: int) -> tuple[nn.Module, torch.optim.Optimizer, object]:
    """A Linear stack of about ``params`` parameters, with AdamW state after one step and a linear schedule."""
    hidden = min(hidden, max(8, int(math.sqrt(params))))
    layers = max(1, round(params / (hidden * hidden + hidden)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=10, num_training_steps=1000)
    model(torch.randn(2, hidden)).sum().backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer, scheduler


def timed(fn: Callable[[], object], repeats: int, cleanup: Callable[[], None] | None = None) -> float:
    """Median wall time of ``fn`` over ``repeats`` calls (``cleanup`` runs after each call, untimed)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if cleanup is not None:
            cleanup()
    return statistics.median(times)


def bare_save(path: Path, model: nn.Module, optimizer, scheduler, fsync: bool) -> None:
    """One ``torch.save`` of the same state dicts trainwell writes (optionally fsynced)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": capture_rng_state()}
    with open(path, "wb") as handle:
        torch.save(state, handle)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())


def bare_load(path: Path, model: nn.Module, optimizer, scheduler) -> None:
    """``torch.load`` (safe mode) and apply every state dict."""
    from trainwell.checkpoint.rng import _numpy_safe_globals

    with torch.serialization.safe_globals(_numpy_safe_globals()):  # the numpy RNG state, as upstream allows it
        state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    restore_rng_state(state["rng"])


class _NoHash:
    """A hash object that does nothing (to time a save without checksums)."""

    def update(self, data: object) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


def save_without_checksums(manager: CheckpointManager, contents: CheckpointContents) -> None:
    """``manager.save`` with the checksum computation replaced by a no-op (benchmark only)."""
    from trainwell.checkpoint import digest, layout

    original, original_hash = digest.new_hasher, layout.hash_file
    digest.new_hasher = lambda algorithm=None: _NoHash()  # type: ignore[assignment]
    layout.hash_file = lambda path, algorithm=None: digest.FileDigest(Path(path).stat().st_size, "")
    try:
        manager.save(1, contents)
    finally:
        digest.new_hasher, layout.hash_file = original, original_hash


def async_blocking(manager: CheckpointManager, contents: CheckpointContents, repeats: int) -> dict[str, float]:
    """Blocking time of ``AsyncSaver.save`` (first save, then the median of ``repeats`` with reused buffers) and
    the time until the background commit is done."""
    from trainwell.checkpoint.async_save import AsyncSaver

    saver, folder = AsyncSaver(), manager.checkpoint_dir(1)
    blocking, total = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        saver.save(manager, 1, contents)
        blocking.append(time.perf_counter() - start)
        saver.wait()
        total.append(time.perf_counter() - start)
        shutil.rmtree(folder)
    return {"async_first_blocking": blocking[0], "async_blocking": statistics.median(blocking[1:]),
            "async_total": statistics.median(total[1:]), "async_host_bytes": saver.copier.nbytes}


def upstream_save(model: nn.Module, optimizer, scheduler, workdir: Path, repeats: int) -> float:
    """Median time of the upstream ``Trainer._save_checkpoint`` of the same state (step 1)."""
    import transformers

    args = transformers.TrainingArguments(output_dir=str(workdir / "upstream"), report_to="none", use_cpu=True)
    trainer = transformers.Trainer(model=model, args=args)
    trainer.optimizer, trainer.lr_scheduler = optimizer, scheduler
    trainer.state.global_step = 1
    folder = workdir / "upstream" / "checkpoint-1"
    return timed(lambda: trainer._save_checkpoint(trainer.model, trial=None), repeats,
                 cleanup=lambda: shutil.rmtree(folder))


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run(params: int, hidden: int, repeats: int, workdir: Path, upstream: bool = True) -> dict[str, float]:
    """Measure everything; returns the timings (seconds) and sizes (bytes)."""
    model, optimizer, scheduler = build_state(params, hidden)
    count = sum(p.numel() for p in model.parameters())
    print(f"model: {len(model)} x Linear({model[0].in_features}, {model[0].out_features}) = {count / 1e6:.1f}M "
          f"parameters ({count * 4 / 1e9:.2f} GB fp32) + AdamW state; median of {repeats} runs in {workdir}")
    manager = CheckpointManager(workdir / "tw")
    contents = CheckpointContents(model=model, optimizer=optimizer, scheduler=scheduler)
    folder = manager.checkpoint_dir(1)
    bare = workdir / "bare.pt"
    results = {
        "trainwell_save": timed(lambda: manager.save(1, contents), repeats,
                                cleanup=lambda: shutil.rmtree(folder) if repeats > 1 else None),
    }
    if not folder.exists():
        manager.save(1, contents)
    results["trainwell_size"] = folder_size(folder)
    results["trainwell_load"] = timed(lambda: manager.load(folder, contents), repeats)
    results["trainwell_load_unverified"] = timed(lambda: manager.load(folder, contents, verify=False), repeats)
    shutil.rmtree(folder)
    results["trainwell_save_no_checksums"] = timed(lambda: save_without_checksums(manager, contents), repeats,
                                                   cleanup=lambda: shutil.rmtree(folder))
    results["bare_save"] = timed(lambda: bare_save(bare, model, optimizer, scheduler, fsync=False), repeats)
    results["bare_save_fsync"] = timed(lambda: bare_save(bare, model, optimizer, scheduler, fsync=True), repeats)
    results["bare_size"] = bare.stat().st_size
    results["bare_load"] = timed(lambda: bare_load(bare, model, optimizer, scheduler), repeats)
    bare.unlink()
    results.update(async_blocking(manager, contents, repeats))
    if upstream:
        results["upstream_save"] = upstream_save(model, optimizer, scheduler, workdir, repeats)
    return results


def report(r: dict[str, float]) -> None:
    """Print the table and the ratios (trainwell / bare)."""
    rows = [("save", r["trainwell_save"], r["bare_save"]), ("save (bare fsynced too)", r["trainwell_save"],
            r["bare_save_fsync"]), ("load", r["trainwell_load"], r["bare_load"])]
    print(f"{'':26s}{'trainwell':>12s}{'torch.save':>12s}{'ratio':>8s}")
    for name, ours, theirs in rows:
        print(f"{name:26s}{ours:11.3f}s{theirs:11.3f}s{ours / theirs:8.2f}")
    print(f"{'size on disk':26s}{r['trainwell_size'] / 1e6:10.1f}MB{r['bare_size'] / 1e6:10.1f}MB"
          f"{r['trainwell_size'] / r['bare_size']:8.3f}")
    print(f"\n{'checksums':26s}{'with':>12s}{'without':>12s}{'ratio':>8s}")
    for name, ours, theirs in [("save (hash while writing)", r["trainwell_save"], r["trainwell_save_no_checksums"]),
                               ("load (verify every file)", r["trainwell_load"], r["trainwell_load_unverified"])]:
        print(f"{name:26s}{ours:11.3f}s{theirs:11.3f}s{ours / theirs:8.2f}")
    print(f"\n{'training blocked by a save':34s}{'seconds':>10s}")
    rows = [("trainwell, synchronous", r["trainwell_save"]),
            ("trainwell async_save, first save", r["async_first_blocking"]),
            ("trainwell async_save", r["async_blocking"]),
            ("  (background commit done after)", r["async_total"])]
    if "upstream_save" in r:
        rows.append(("upstream Trainer (no fsync)", r["upstream_save"]))
    for name, seconds in rows:
        print(f"{name:34s}{seconds:9.3f}s")
    print(f"{'async_save host buffers':34s}{r['async_host_bytes'] / 1e9:9.2f}GB")


def run_ranks(params: int, hidden: int, repeats: int, workdir: Path) -> dict[str, float] | None:
    """Blocking time per save on every rank of the launched process group (DDP: the same state everywhere).

    Returns the slowest rank's medians on rank 0 (None on the others).
    """
    import torch.distributed as dist

    from trainwell.checkpoint.async_save import AsyncSaver, new_saver_group

    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, scheduler = build_state(params, hidden)
    manager = CheckpointManager(workdir / "tw", rank=rank, world_size=world, should_save=rank == 0)
    contents = CheckpointContents(model=model, optimizer=optimizer, scheduler=scheduler)
    folder = manager.checkpoint_dir(1)

    def remove() -> None:
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder)
        dist.barrier()

    sync = timed(lambda: manager.save(1, contents), repeats, cleanup=remove)
    saver, blocking, total = AsyncSaver(group=new_saver_group()), [], []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        saver.save(manager, 1, contents)
        blocking.append(time.perf_counter() - start)
        saver.wait()
        total.append(time.perf_counter() - start)
        remove()
    mine = {"ranks_sync": sync, "ranks_async_first_blocking": blocking[0],
            "ranks_async_blocking": statistics.median(blocking[1:]), "ranks_async_total": statistics.median(total[1:])}
    every = [None] * world
    dist.all_gather_object(every, mine)
    return {key: max(r[key] for r in every) for key in mine} if rank == 0 else None


def report_ranks(r: dict[str, float], params: int, world: int) -> None:
    """Print the blocking times measured with several ranks."""
    print(f"{world} ranks (gloo), about {params / 1e6:.0f}M parameters + AdamW on each; slowest rank, median")
    print(f"{'training blocked by a save':34s}{'seconds':>10s}")
    rows = (("trainwell, synchronous", "ranks_sync"), ("async_save, first save", "ranks_async_first_blocking"),
            ("async_save", "ranks_async_blocking"), ("  (background commit done after)", "ranks_async_total"))
    for name, key in rows:
        print(f"{name:34s}{r[key]:9.3f}s")


def main_ranks(options: argparse.Namespace) -> int:
    """The several-process measurement (under torchrun): a shared temporary folder named by rank 0."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        tmp = tempfile.mkdtemp(dir=options.dir, prefix="bench-checkpoint-") if dist.get_rank() == 0 else None
        shared = [tmp]
        dist.broadcast_object_list(shared, src=0)
        try:
            result = run_ranks(int(options.params), options.hidden, options.repeats, Path(shared[0]))
        finally:
            dist.barrier()
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        if result is not None:
            report_ranks(result, int(options.params), dist.get_world_size())
    finally:
        dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the benchmark in a temporary folder (or ``--dir``), print the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6, help="number of parameters (default 1e8)")
    parser.add_argument("--hidden", type=int, default=4096, help="width of each Linear layer")
    parser.add_argument("--repeats", type=int, default=3, help="timed repetitions (the median is reported)")
    parser.add_argument("--no-upstream", action="store_true", help="skip the upstream Trainer's save")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary folder, deleted after)")
    options = parser.parse_args(argv)
    if options.params < 1 or options.repeats < 1:
        parser.error("--params and --repeats must be positive")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        torch.set_num_threads(1)
        return main_ranks(options)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    with tempfile.TemporaryDirectory(dir=options.dir, prefix="bench-checkpoint-") as tmp:
        report(run(int(options.params), options.hidden, options.repeats, Path(tmp), not options.no_upstream))
    return 0


if __name__ == "__main__":
    sys.exit(main())
