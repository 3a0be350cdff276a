"""How trainwell's checkpoint protocol grows with the number of ranks: a simulation with N gloo processes.

Not training: every rank runs the real trainwell functions of a save's commit and a resume's discovery on a small
checkpoint, so what is timed is the protocol (collectives, marker, checksums, metadata operations), not the bytes
of a model.

* ``commit``: :func:`trainwell.checkpoint.commit.commit_checkpoint` as a DDP save runs it: rank 0 writes the shared
  files (``model.safetensors`` of ``--model-bytes`` and four small files), every rank its ``rng_state_<rank>.pth``
  (hashed and fsynced as written), then every rank its engine shard of ``--shard-bytes`` (written as DCP or ZeRO
  write theirs: not through trainwell's hashing writer); the three object all-gathers of the protocol; rank 0 checks
  every reported file, fsyncs and hashes the engine shards, writes the ``.complete`` marker listing every rank's
  files and renames the folder into place.
  ``--checkpoints`` saves, each timed.
* ``discovery``: the resume's agreement, :func:`trainwell.checkpoint.agreement.candidates` (every rank lists
  ``output_dir``; the names are all-gathered) and :func:`~trainwell.checkpoint.agreement.load_agreed` (every rank
  verifies its share of the newest checkpoint's files against the marker, sizes and checksums, the ranks of a node
  splitting the files, plus its own RNG file; two agreement all-gathers; the load itself is a no-op here).

Ranks are grouped into simulated nodes of ``--ranks-per-node`` (``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` as torchrun
sets them); every rank sees one folder (a shared file system). Per rank and phase: wall seconds (the slowest
rank's, after a barrier), the number of collectives, and the bytes of the object all-gathers (what this rank sends
= its pickled object; what it receives = ``world size x`` the largest pickled object, as ``all_gather_object``
pads every rank's to the largest, plus one 8-byte size per rank) and the bytes it read back to hash.

    python bench/scale_protocol.py                       # 2, 4, 8, 16, 32 processes, about a minute per size
    python bench/scale_protocol.py --procs 2 --json scale.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))


# ------------------------------------------------------------------------------------------------ one rank


class _Counted:
    """Collectives and all-gather bytes seen by one rank in one phase."""

    def __init__(self) -> None:
        self.collectives = 0
        self.sent = 0
        self.received = 0
        self.hashed = 0  # bytes this rank read back to hash (trainwell hashes its own files while writing them)

    def gathered(self, mine: Any, every: list[Any]) -> None:
        self.collectives += 1
        self.sent += len(pickle.dumps(mine)) + 8
        self.received += len(every) * (max(len(pickle.dumps(o)) for o in every) + 8)


def _counting_ranks(rank: int, world: int, counter: list[_Counted]) -> Any:
    from trainwell.checkpoint.ranks import Ranks

    class CountingRanks(Ranks):
        """trainwell's Ranks, counting what its collectives move (``counter[0]``: the current phase)."""

        def gather(self, obj: Any) -> list[Any]:
            every = super().gather(obj)
            counter[0].gathered(obj, every)
            return every

        def barrier(self) -> None:
            counter[0].collectives += 1
            super().barrier()

    return CountingRanks(rank, world)


class _Manager:
    """What :func:`load_agreed` needs of a CheckpointManager; ``load`` is a no-op (the protocol, not the bytes)."""

    trust_pickles = True  # the simulated files are not pickles

    def __init__(self, output_dir: Path, rank: int, world_size: int, ranks: Any) -> None:
        self.output_dir, self.rank, self.world_size, self._ranks = output_dir, rank, world_size, ranks

    @property
    def ranks(self) -> Any:
        return self._ranks

    @property
    def rng_file(self) -> str:
        return f"rng_state_{self.rank}.pth"

    def load(self, folder: Any, contents: Any, **kwargs: Any) -> dict[str, Any]:
        return {}


def rank_main(ns: argparse.Namespace) -> int:
    """One process of the simulation: the commits, then the discovery; prints its numbers as one JSON line."""
    import torch.distributed as dist

    from trainwell.checkpoint import agreement, digest
    from trainwell.checkpoint.commit import commit_checkpoint

    from trainwell.checkpoint import layout

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    root = Path(ns.output_dir)
    counter = [_Counted()]
    hash_file = layout.hash_file

    def counted_hash(path: Any, algorithm: Any = None) -> Any:
        found = hash_file(path, algorithm)
        counter[0].hashed += found.size
        return found

    from trainwell.checkpoint import sync

    layout.hash_file = sync.hash_file = counted_hash  # counted, not changed (the seal hashes through sync)
    ranks = _counting_ranks(rank, world, counter)
    model, shard = os.urandom(ns.model_bytes), os.urandom(ns.shard_bytes)

    def write_files(tmp: Path) -> None:
        if rank == 0:
            digest.write_bytes(tmp / "model.safetensors", model)
            for name in ("optimizer.pt", "scheduler.pt", "trainer_state.json", "training_args.bin"):
                digest.write_bytes(tmp / name, b"x" * 1024)
        digest.write_bytes(tmp / f"rng_state_{rank}.pth", os.urandom(16 * 1024))

    def engine_save(tmp: Path) -> None:  # a sharded engine (DCP, ZeRO): each rank writes its shard, not hashed
        if ns.shard_bytes:
            (tmp / "shards").mkdir(exist_ok=True)
            (tmp / "shards" / f"__{rank}_0.distcp").write_bytes(shard)

    result: dict[str, Any] = {"rank": rank, "commit": [], "discovery": []}
    for step in range(1, ns.checkpoints + 1):
        counter[0] = _Counted()
        dist.barrier()
        start = time.perf_counter()
        commit_checkpoint(root / f"checkpoint-{step}", step, ranks, should_save=rank == 0, write_files=write_files,
                          engine_save=engine_save)
        took = time.perf_counter() - start
        result["commit"].append({"seconds": took, **vars(counter[0])})
    for _ in range(ns.checkpoints):
        counter[0] = _Counted()
        dist.barrier()
        start = time.perf_counter()
        manager = _Manager(root, rank, world, ranks)
        folders = agreement.candidates(manager)
        folder, _ = agreement.load_agreed(manager, folders, None, fallback=True)
        took = time.perf_counter() - start
        assert folder.name == f"checkpoint-{ns.checkpoints}", folder
        result["discovery"].append({"seconds": took, **vars(counter[0])})
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ the driver


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_size(procs: int, ns: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Launch ``procs`` ranks on this machine; the slowest rank's median seconds and rank 0's / the mean bytes."""
    output_dir = workdir / f"out-{procs}"
    port = _free_port()
    per_node = min(ns.ranks_per_node, procs)
    command = [sys.executable, str(Path(__file__).resolve()), "--rank-process", "--output-dir", str(output_dir),
               "--model-bytes", str(ns.model_bytes), "--shard-bytes", str(ns.shard_bytes),
               "--checkpoints", str(ns.checkpoints)]
    children = []
    load_before = os.getloadavg()
    start = time.perf_counter()
    for rank in range(procs):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(procs), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node),
               "GROUP_RANK": str(rank // per_node), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        children.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for child in children:
        out, err = child.communicate(timeout=ns.timeout)
        if child.returncode != 0:
            raise RuntimeError(f"a rank of the {procs}-process run failed:\n{err[-3000:]}")
        results.append(json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:]))
    row: dict[str, Any] = {"procs": procs, "ranks_per_node": per_node, "load_average": load_before,
                           "launch_seconds": time.perf_counter() - start}
    for phase in ("commit", "discovery"):
        slowest = [max(r[phase][i]["seconds"] for r in results) for i in range(ns.checkpoints)]
        rank0, others = results[0][phase][-1], [r[phase][-1] for r in results[1:]]
        row[phase] = {
            "seconds_median": statistics.median(slowest), "seconds_all": slowest,
            "collectives": rank0["collectives"],
            "bytes_sent_rank0": rank0["sent"], "bytes_received_per_rank": rank0["received"],
            "bytes_sent_other_rank_mean": statistics.mean(o["sent"] for o in others) if others else 0,
            "bytes_hashed_rank0": rank0["hashed"], "bytes_hashed_per_rank_max": max(r[phase][-1]["hashed"]
                                                                                    for r in results),
        }
    return row


def format_report(result: dict[str, Any]) -> str:
    """The table docs/scale.md shows."""
    lines = [f"{'procs':>5} {'load':>5} | {'commit s':>9} {'coll':>4} {'B sent r0':>10} {'B sent r>0':>10} "
             f"{'B recv/rank':>11} {'hashed r0':>10} | {'discover s':>10} {'coll':>4} {'B sent r0':>10} "
             f"{'B recv/rank':>11} {'hashed max':>10}"]
    for row in result["rows"]:
        c, d = row["commit"], row["discovery"]
        lines.append(f"{row['procs']:>5} {row['load_average'][0]:>5.2f} | {c['seconds_median']:>9.4f} "
                     f"{c['collectives']:>4} {c['bytes_sent_rank0']:>10} {c['bytes_sent_other_rank_mean']:>10.0f} "
                     f"{c['bytes_received_per_rank']:>11} {c['bytes_hashed_rank0']:>10} | "
                     f"{d['seconds_median']:>10.4f} {d['collectives']:>4} {d['bytes_sent_rank0']:>10} "
                     f"{d['bytes_received_per_rank']:>11} {d['bytes_hashed_per_rank_max']:>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", help=argparse.SUPPRESS)
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8, 16, 32])
    parser.add_argument("--ranks-per-node", type=int, default=8, help="simulated node size (default 8)")
    parser.add_argument("--model-bytes", type=int, default=1 << 20, help="size of model.safetensors (default 1 MiB)")
    parser.add_argument("--shard-bytes", type=int, default=256 << 10,
                        help="bytes of each rank's engine shard, as DCP/ZeRO write them (default 256 KiB; 0: none)")
    parser.add_argument("--checkpoints", type=int, default=3, help="saves timed per size, then as many discoveries")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one size may take")
    parser.add_argument("--json", type=Path, help="also write the raw results to this json file")
    parser.add_argument("--workdir", type=Path, help="where the checkpoints go (default: a temporary folder)")
    ns = parser.parse_args(argv)
    if ns.rank_process:
        return rank_main(ns)
    result: dict[str, Any] = {"config": {k: v for k, v in vars(ns).items() if k not in ("json", "workdir")},
                              "rows": []}
    with contextlib.ExitStack() as stack:
        workdir = ns.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-protocol-")))
        for procs in ns.procs:
            row = run_size(procs, ns, workdir)
            result["rows"].append(row)
            print(f"{procs} processes: commit {row['commit']['seconds_median']:.4f} s, discovery "
                  f"{row['discovery']['seconds_median']:.4f} s, load {os.getloadavg()[0]:.2f}", flush=True)
    print("\n" + format_report(result))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
