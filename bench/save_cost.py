"""What frequent checkpoints cost: a small model saved every 10 steps, trainwell against upstream
``transformers.Trainer`` in the same run.

The job: a tiny GPT-2 (``GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64)``, about 0.1M
parameters, built from the same seed on every side), causal-LM loss on seeded random tokens (batch 8, 32 tokens),
AdamW, ``--steps`` optimizer steps (400) with ``save_strategy="steps"``, ``save_steps=--save-steps`` (10: 40
checkpoints, every one kept), one torch thread, on the CPU. Each side runs in its own subprocess (``--worker``), so
imports and one-off costs (the first save's) are counted where a user's script pays them; the rounds interleave
the sides (upstream, trainwell, upstream, ...) so that load on the machine affects both alike.

Reported per side (the median over ``--rounds``):

* ``train_runtime``: the ``train_runtime`` metric ``train()`` returns (the whole loop, saves included);
* ``cpu_seconds``: process CPU time (every thread) over the ``train()`` call;
* ``seconds_per_checkpoint``: the median time of one ``_save_checkpoint`` call (timed by a subclass on each side),
  and ``first_checkpoint_seconds``, the first one (one-off imports land there);
* ``fsync_calls`` and ``fsync_seconds``: the ``fsync``/``fdatasync`` system calls of the whole process and the wall
  time spent in them, counted by ``strace -f -c -w -e trace=fsync,fdatasync --seccomp-bpf`` (only those calls stop
  the process) when strace works here, else by counting Python's ``os.fsync``/``os.fdatasync`` in the child
  (``fsync_counter`` says which);
* ``deepspeed_imported``: whether ``deepspeed`` was in ``sys.modules`` after the run (neither side uses it).

Ratios are trainwell / upstream of the same run. Upstream writes without any fsync; trainwell syncs what its commit
protocol needs (:mod:`trainwell.checkpoint.commit`), so its count is the price of the crash-safety guarantee.

    python bench/save_cost.py                       # 400 steps, 40 checkpoints, 3 rounds: ~3 min on 2 busy cores
    python bench/save_cost.py --quick --json r.json # smoke test: 40 steps, 4 checkpoints, 1 round
    python bench/save_cost.py --sides trainwell     # one side only (no ratios)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIDES = {"upstream": "transformers", "trainwell": "trainwell"}  # side -> the library its Trainer comes from


@dataclass
class SaveCostConfig:
    """Sizes of the run."""

    steps: int = 400
    save_steps: int = 10
    rounds: int = 3
    batch_size: int = 8
    seq_len: int = 32
    seed: int = 0
    sides: list[str] = field(default_factory=lambda: list(SIDES))
    timeout: float = 600.0


# ------------------------------------------------------------------------------------------------ the job


def _count_python_fsyncs() -> dict[str, int]:
    """Count ``os.fsync``/``os.fdatasync`` calls from here on (the fallback without strace)."""
    counts = {"calls": 0}
    for name in ("fsync", "fdatasync"):
        original = getattr(os, name, None)
        if original is None:
            continue

        def counted(fd: Any, _original: Any = original) -> None:
            counts["calls"] += 1
            return _original(fd)

        setattr(os, name, counted)
    return counts


def _dataset(cfg: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    generator = torch.Generator().manual_seed(cfg.seed)
    tokens = torch.randint(0, 256, (64, cfg.seq_len), generator=generator)
    return [{"input_ids": row, "labels": row} for row in tokens]


def worker(ns: argparse.Namespace) -> int:
    """One side's run: build the model and trainer, train with the saves, write the measurements to ``ns.out``."""
    counts = _count_python_fsyncs() if ns.count_python_fsyncs else None
    if SIDES[ns.side] == "trainwell" and str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # this checkout's trainwell, installed or not
    import importlib

    import torch
    import transformers

    lib = importlib.import_module(SIDES[ns.side])
    torch.set_num_threads(1)
    torch.manual_seed(ns.seed)
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    timings: list[float] = []

    class TimedTrainer(lib.Trainer):  # type: ignore[name-defined, misc]
        """Times each checkpoint (both libraries save through ``_save_checkpoint``)."""

        def _save_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return super()._save_checkpoint(*args, **kwargs)
            finally:
                timings.append(time.perf_counter() - start)

    args = lib.TrainingArguments(
        output_dir=ns.output_dir, max_steps=ns.steps, save_strategy="steps", save_steps=ns.save_steps,
        per_device_train_batch_size=ns.batch_size, learning_rate=1e-3, logging_steps=max(ns.steps, 1),
        report_to="none", disable_tqdm=True, use_cpu=True, seed=ns.seed, dataloader_num_workers=0)
    trainer = TimedTrainer(model=model, args=args, train_dataset=_dataset(ns))
    cpu, wall = time.process_time(), time.perf_counter()
    output = trainer.train()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    with torch.no_grad():
        fingerprint = sum(float(p.double().abs().sum()) for p in trainer.model.parameters())
    result = {"side": ns.side, "train_runtime": float(output.metrics["train_runtime"]), "train_wall": wall,
              "cpu_seconds": cpu, "saves": len(timings), "save_seconds": timings,
              "seconds_per_checkpoint": statistics.median(timings) if timings else None,
              "first_checkpoint_seconds": timings[0] if timings else None,
              "deepspeed_imported": "deepspeed" in sys.modules, "final_loss": float(output.training_loss),
              "fingerprint": fingerprint, "python_fsync_calls": None if counts is None else counts["calls"]}
    Path(ns.out).write_text(json.dumps(result))
    return 0


# ------------------------------------------------------------------------------------------ the supervisor


def strace_works() -> bool:
    """Whether ``strace --seccomp-bpf -c`` can trace a child here (ptrace may be forbidden in a container)."""
    if shutil.which("strace") is None:
        return False
    done = subprocess.run(["strace", "-f", "--seccomp-bpf", "-c", "-e", "trace=fsync", "-o", os.devnull, "true"],
                          capture_output=True, timeout=30)
    return done.returncode == 0


def parse_strace_summary(text: str) -> tuple[int, float]:
    """``(calls, seconds)`` of fsync + fdatasync from an ``strace -c -w`` summary table."""
    calls, seconds = 0, 0.0
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[-1] in ("fsync", "fdatasync") and re.fullmatch(r"[\d.]+", parts[1] if len(parts) > 1 else ""):
            # % time, seconds, usecs/call, calls, [errors,] syscall
            seconds += float(parts[1])
            calls += int(parts[3])
    return calls, seconds


def run_side(cfg: SaveCostConfig, side: str, workdir: Path, round_: int, use_strace: bool) -> dict[str, Any]:
    """Launch one side's job in a subprocess; its measurements, with the fsync count."""
    out, summary = workdir / f"{side}-{round_}.json", workdir / f"{side}-{round_}.strace"
    output_dir = workdir / f"{side}-{round_}-out"
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--side", side, "--out", str(out),
               "--output-dir", str(output_dir), "--steps", str(cfg.steps), "--save-steps", str(cfg.save_steps),
               "--batch-size", str(cfg.batch_size), "--seq-len", str(cfg.seq_len), "--seed", str(cfg.seed)]
    if use_strace:
        command = ["strace", "-f", "--seccomp-bpf", "-c", "-w", "-e", "trace=fsync,fdatasync", "-o", str(summary),
                   *command]
    else:
        command.append("--count-python-fsyncs")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=cfg.timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} job failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result = json.loads(out.read_text())
    if use_strace:
        result["fsync_calls"], result["fsync_seconds"] = parse_strace_summary(summary.read_text())
    else:
        result["fsync_calls"], result["fsync_seconds"] = result["python_fsync_calls"], None
    result["fsync_counter"] = "strace" if use_strace else "os.fsync"
    result["round"] = round_
    shutil.rmtree(output_dir, ignore_errors=True)
    return result


SUMMARY_FIELDS = ("train_runtime", "cpu_seconds", "seconds_per_checkpoint", "first_checkpoint_seconds",
                  "fsync_calls", "fsync_seconds")


def summarize(rows: list[dict[str, Any]], sides: list[str]) -> dict[str, Any]:
    """Per side the median of each field over the rounds; ratios trainwell / upstream when both ran."""
    summary: dict[str, Any] = {}
    for side in sides:
        mine = [row for row in rows if row["side"] == side]
        entry: dict[str, Any] = {}
        for name in SUMMARY_FIELDS:
            values = [row[name] for row in mine if row.get(name) is not None]
            entry[name] = statistics.median(values) if values else None
        entry["saves"] = mine[0]["saves"]
        entry["fsync_per_checkpoint"] = (None if entry["fsync_calls"] is None or not entry["saves"]
                                         else entry["fsync_calls"] / entry["saves"])
        entry["deepspeed_imported"] = any(row["deepspeed_imported"] for row in mine)
        summary[side] = entry
    ratios = {}
    if {"trainwell", "upstream"} <= set(summary):
        for name in ("train_runtime", "cpu_seconds", "seconds_per_checkpoint"):
            mine, theirs = summary["trainwell"][name], summary["upstream"][name]
            ratios[name] = None if not mine or not theirs else mine / theirs
    return {"sides": summary, "ratios": ratios}


def run(cfg: SaveCostConfig, workdir: Path) -> dict[str, Any]:
    """Every round of every side (interleaved); the raw rows and the summary."""
    use_strace = strace_works()
    rows = []
    for round_ in range(cfg.rounds):
        for side in cfg.sides:
            row = run_side(cfg, side, workdir, round_, use_strace)
            print(f"round {round_ + 1}/{cfg.rounds} {side:9s}: train_runtime {row['train_runtime']:.2f} s, "
                  f"{row['saves']} checkpoints, {row['seconds_per_checkpoint'] * 1000:.1f} ms each, "
                  f"{row['fsync_calls']} fsyncs", flush=True)
            rows.append(row)
    return {"config": asdict(cfg), "fsync_counter": "strace" if use_strace else "os.fsync", "rows": rows,
            **summarize(rows, cfg.sides)}


def format_report(result: dict[str, Any]) -> str:
    """The summary table and the ratios."""
    cfg, sides = result["config"], result["sides"]
    lines = [f"tiny GPT-2, {cfg['steps']} steps, a checkpoint every {cfg['save_steps']} steps; median of "
             f"{cfg['rounds']} round(s); fsyncs counted by {result['fsync_counter']}",
             f"{'':10s}{'train_runtime':>14s}{'CPU':>9s}{'per ckpt':>10s}{'first ckpt':>12s}{'fsyncs':>8s}"
             f"{'per ckpt':>9s}{'fsync s':>9s}  deepspeed imported"]

    def number(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    for side, s in sides.items():
        lines.append(f"{side:10s}{number(s['train_runtime'], '13.2f')}s{number(s['cpu_seconds'], '8.2f')}s"
                     f"{number(s['seconds_per_checkpoint'] and s['seconds_per_checkpoint'] * 1000, '8.1f')}ms"
                     f"{number(s['first_checkpoint_seconds'] and s['first_checkpoint_seconds'] * 1000, '10.1f')}ms"
                     f"{number(s['fsync_calls'], '8d')}{number(s['fsync_per_checkpoint'], '9.1f')}"
                     f"{number(s['fsync_seconds'], '9.3f')}  {s['deepspeed_imported']}")
    for name, ratio in result["ratios"].items():
        lines.append(f"ratio trainwell / upstream, {name}: {number(ratio, '.2f')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--quick``, ``--steps``, ``--save-steps``, ``--rounds``, ``--sides``, ``--json PATH``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", help=argparse.SUPPRESS)
    parser.add_argument("--count-python-fsyncs", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=SaveCostConfig.steps)
    parser.add_argument("--save-steps", type=int, default=SaveCostConfig.save_steps)
    parser.add_argument("--rounds", type=int, default=SaveCostConfig.rounds)
    parser.add_argument("--batch-size", type=int, default=SaveCostConfig.batch_size)
    parser.add_argument("--seq-len", type=int, default=SaveCostConfig.seq_len)
    parser.add_argument("--seed", type=int, default=SaveCostConfig.seed)
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), help="default: both")
    parser.add_argument("--quick", action="store_true", help="smoke test: 40 steps (4 checkpoints), 1 round")
    parser.add_argument("--json", type=Path, help="also write the raw results to this json file")
    parser.add_argument("--workdir", type=Path, help="where the runs write (default: a temporary folder)")
    ns = parser.parse_args(argv)
    if ns.worker:
        return worker(ns)
    cfg = SaveCostConfig(steps=ns.steps, save_steps=ns.save_steps, rounds=ns.rounds, batch_size=ns.batch_size,
                         seq_len=ns.seq_len, seed=ns.seed, sides=ns.sides or list(SIDES))
    if ns.quick:
        cfg = replace(cfg, steps=40, rounds=1)
    with contextlib.ExitStack() as stack:
        workdir = ns.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="save-cost-bench-")))
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(cfg, workdir)
    print("\n" + format_report(result))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
