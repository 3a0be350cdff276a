"""Overhead benchmark: trainwell's Trainer against a hand-written PyTorch loop (and transformers.Trainer).

Each case trains one MLP on synthetic data, the same for every runner, from the same initial weights, with the same optimizer (AdamW, no weight decay), schedule (linear with warmup), gradient
clipping (max norm 1.0) and the same batches in the same order (epoch ``e`` visits ``randperm(n, seed + e)``,
the order trainwell's sampler uses). Rounds are interleaved (hand, trainwell, transformers, hand, ...) so that
load on the machine affects all runners alike; each time covers a full ``train()`` call (the hand loop: creating
the optimizer, schedule and loaders, and every step). The final weights of the hand loop and trainwell are
compared, which shows that both did exactly the same optimisation.

The cases (``--case``, default all):

* ``mlp``: 64 -> 256 -> 256 -> 10, batch 32, 512 steps, 3 rounds (the first case, kept for comparison);
* ``small``: 32 -> 64 -> 4, batch 32, 256 steps, 5 rounds: the shortest steps, where a fixed cost per ``train()``
  and a per-step cost show most (a GPU's step on a small model is this short);
* ``small-long``: the same model over 1024 steps (the per-step cost without most of the fixed cost);
* ``collator``: the small model, 1024 steps, with a user-written ``data_collator`` (a plain function stacking the
  batch; the hand loop's DataLoader gets it too), as most users pass one.

It also times what ``from trainwell import Trainer, TrainingArguments`` adds to ``import torch`` in fresh
interpreters (and the same for transformers when it is installed).

    python bench/overhead.py                # every case
    python bench/overhead.py --case small   # one case
    python bench/overhead.py --quick        # shorter runs (a quarter of the steps, 2 rounds)
    python bench/overhead.py --opcodes      # Python bytecodes per optimizer step (deterministic, for a busy machine)
    python bench/overhead.py --optim adamw_torch_fused  # every runner with the fused AdamW (upstream's default)

``--opcodes`` counts the bytecode instructions the interpreter runs per optimizer step in each runner (the difference
of a 40-step and a 20-step run, so set-up costs cancel), per function: the Python-level overhead without any timing
noise. It does not see the time spent inside torch's C++ kernels, which is the same for every runner.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


@dataclass
class BenchConfig:
    """Sizes and hyper-parameters shared by every runner."""

    steps: int = 512
    rounds: int = 3
    widths: tuple[int, ...] = (64, 256, 256, 10)  # input, hidden..., classes
    user_collator: bool = False  # every runner's loader collates with :func:`stack_batch`
    n_samples: int = 2048
    batch_size: int = 32
    learning_rate: float = 1e-3
    warmup_steps: int = 50
    max_grad_norm: float = 1.0
    seed: int = 0
    threads: int = 1
    import_repeats: int = 5
    optim: str = "adamw_torch"  # or "adamw_torch_fused" (upstream's default): the hand loop then passes fused=True

    def describe(self) -> str:
        """The model and run in words, for the report's title."""
        collator = ", user data_collator" if self.user_collator else ""
        return (f"MLP {'-'.join(map(str, self.widths))}, batch {self.batch_size}, {self.steps} steps{collator}, "
                f"{self.rounds} interleaved rounds")


CASES: dict[str, BenchConfig] = {
    "mlp": BenchConfig(),
    "small": BenchConfig(steps=256, rounds=5, widths=(32, 64, 4)),
    "small-long": BenchConfig(steps=1024, rounds=5, widths=(32, 64, 4)),
    "collator": BenchConfig(steps=1024, rounds=5, widths=(32, 64, 4), user_collator=True),
}


# ------------------------------------------------------------------------------------------- model, data


class MLP(nn.Module):
    """A ReLU classifier of the given layer widths returning ``{"loss", "logits"}`` (mean cross entropy)."""

    def __init__(self, widths: tuple[int, ...] = BenchConfig.widths) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for n_in, n_out in zip(widths, widths[1:]):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.net(x)
        if labels is None:
            return {"logits": logits}
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class ToyDataset(Dataset):
    """Gaussian inputs labelled by a fixed random linear map: ``{"x": float[features], "labels": long}`` items."""

    def __init__(self, n: int, seed: int, features: int = 64, classes: int = 10) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, features, generator=generator)
        self.labels = (self.x @ torch.randn(features, classes, generator=generator)).argmax(dim=1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.labels[index]}


def stack_batch(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A user-written collator: each key's tensors stacked (what most users' ``data_collator`` amounts to)."""
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


def dataset_for(cfg: BenchConfig) -> ToyDataset:
    """The case's synthetic data."""
    return ToyDataset(cfg.n_samples, cfg.seed, features=cfg.widths[0], classes=cfg.widths[-1])


def fresh_model(seed: int, widths: tuple[int, ...] = BenchConfig.widths) -> MLP:
    """The same initial weights for every runner."""
    torch.manual_seed(seed)
    return MLP(widths)


def linear_warmup(warmup: int, total: int) -> Callable[[int], float]:
    """The multiplier of the linear schedule with warmup (upstream's formula)."""

    def factor(step: int) -> float:
        if step < warmup:
            return step / max(1, warmup)
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


# ------------------------------------------------------------------------------------------------- runners


def run_hand(cfg: BenchConfig, data: Dataset, model: MLP, workdir: str) -> float:
    """The hand-written loop; returns the mean training loss over all steps."""
    fused = {"fused": True} if cfg.optim == "adamw_torch_fused" else {}
    # the two parameter groups every Trainer-style loop builds (as transformers' *_no_trainer examples do): weights
    # with weight decay, biases without; equal work to the Trainer's optimizer, whose groups users index
    decay = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    no_decay = [p for name, p in model.named_parameters() if name.endswith("bias")]
    groups = [{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.learning_rate, weight_decay=0.0, **fused)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup(cfg.warmup_steps, cfg.steps))
    model.train()
    step, epoch, total = 0, 0, torch.zeros(())
    while step < cfg.steps:
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(cfg.seed + epoch)).tolist()
        collate = {"collate_fn": stack_batch} if cfg.user_collator else {}
        for batch in DataLoader(data, batch_size=cfg.batch_size, sampler=order, **collate):
            loss = model(**batch)["loss"]
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            total += loss.detach()
            step += 1
            if step == cfg.steps:
                break
        epoch += 1
    return float(total) / step


def _common_args(cfg: BenchConfig, workdir: str) -> dict[str, Any]:
    """TrainingArguments shared by trainwell and transformers: no eval, no save, rare logging, no bars."""
    return dict(
        output_dir=workdir, max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate, weight_decay=0.0, warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="linear", max_grad_norm=cfg.max_grad_norm, optim=cfg.optim,
        logging_steps=cfg.steps, eval_strategy="no", save_strategy="no", report_to="none",
        disable_tqdm=True, seed=cfg.seed, dataloader_num_workers=0, use_cpu=True,
    )


def run_trainwell(cfg: BenchConfig, data: Dataset, model: MLP, workdir: str) -> float:
    """trainwell's Trainer; only ``train()`` is timed by the caller's clock (see :func:`timed`)."""
    from trainwell import Trainer, TrainingArguments

    collator = {"data_collator": stack_batch} if cfg.user_collator else {}
    trainer = Trainer(model=model, args=TrainingArguments(**_common_args(cfg, workdir)), train_dataset=data,
                      **collator)
    return _timed_train(trainer)


def run_transformers(cfg: BenchConfig, data: Dataset, model: MLP, workdir: str) -> float:
    """transformers' Trainer with the same settings."""
    from transformers import Trainer, TrainingArguments

    collator = {"data_collator": stack_batch} if cfg.user_collator else {}
    trainer = Trainer(model=model, args=TrainingArguments(**_common_args(cfg, workdir)), train_dataset=data,
                      **collator)
    return _timed_train(trainer)


_LAST_TRAIN_SECONDS: list[tuple[float, float]] = []


def _timed_train(trainer: Any) -> float:
    """Run ``trainer.train()``, recording its wall time (construction of the Trainer is not counted)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    output = trainer.train()
    _LAST_TRAIN_SECONDS.append((time.perf_counter() - start, time.process_time() - cpu_start))
    return float(output.training_loss)


def timed(runner: Callable[..., float], cfg: BenchConfig, data: Dataset) -> tuple[tuple[float, float], float, MLP]:
    """((wall seconds, process CPU seconds), mean training loss, trained model) of one run from fresh weights.

    CPU time is reported too because it is far less sensitive than wall time to other processes on a busy
    machine (with one torch thread it is the compute this run needed).
    """
    model = fresh_model(cfg.seed, cfg.widths)
    _LAST_TRAIN_SECONDS.clear()
    with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
        start, cpu_start = time.perf_counter(), time.process_time()  # the trainers' final log line is silenced
        loss = runner(cfg, data, model, workdir)
        own = (time.perf_counter() - start, time.process_time() - cpu_start)
        seconds = _LAST_TRAIN_SECONDS[-1] if _LAST_TRAIN_SECONDS else own
    return seconds, loss, model


# ------------------------------------------------------------------------------------------------- imports


_IMPORT_SNIPPET = (
    "import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); {stmt}; "
    "print(time.perf_counter() - t1)"
)


def import_overhead(stmt: str, repeats: int) -> float | None:
    """Median seconds that ``stmt`` adds after ``import torch``, each in a fresh interpreter (None if it fails)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    times = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-c", _IMPORT_SNIPPET.format(stmt=stmt)], capture_output=True,
                              text=True, env=env)
        if proc.returncode != 0:
            return None
        times.append(float(proc.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def has_transformers() -> bool:
    """Whether transformers.Trainer can run: transformers and accelerate importable (checked without importing).

    transformers.Trainer refuses to start without accelerate (``pip install transformers[torch]``).
    """
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("transformers", "accelerate"))


# ------------------------------------------------------------------------------------------------- opcodes


def count_opcodes(runner: Callable[..., float], data: Dataset, steps: int,
                  case: BenchConfig = CASES["mlp"]) -> dict[str, float]:
    """Bytecodes executed per optimizer step by ``runner`` on ``case``'s model, per ``file:function`` (a ``steps``
    and a ``2 * steps`` run are traced; their difference over ``steps``)."""
    import collections

    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        if event == "opcode":
            code = frame.f_code
            counts[f"{code.co_filename.split('site-packages/')[-1].replace(str(REPO) + '/', '')}:{code.co_name}"] += 1
        return tracer

    def traced(n: int) -> dict[str, int]:
        cfg = replace(case, steps=n, warmup_steps=2)
        counts.clear()
        with tempfile.TemporaryDirectory() as workdir, contextlib.redirect_stdout(io.StringIO()):
            model = fresh_model(cfg.seed, cfg.widths)
            previous = sys.gettrace()  # a debugger's or coverage's tracer is put back
            sys.settrace(tracer)
            try:
                runner(cfg, data, model, workdir)
            finally:
                sys.settrace(previous)
        return dict(counts)

    traced(2)  # first-call costs (lazy imports)
    short, long = traced(steps), traced(2 * steps)
    return {name: (long.get(name, 0) - short.get(name, 0)) / steps for name in set(short) | set(long)}


def opcode_report(case: str = "mlp", steps: int = 20, top: int = 25) -> str:
    """Bytecodes per step of the hand loop and trainwell on ``case``, and the functions where they differ most."""
    torch.set_num_threads(1)
    cfg = CASES[case]
    data = dataset_for(cfg)
    hand, ours = count_opcodes(run_hand, data, steps, cfg), count_opcodes(run_trainwell, data, steps, cfg)
    total_hand, total_ours = sum(hand.values()), sum(ours.values())
    lines = [f"{case}: Python bytecodes per optimizer step: hand loop {total_hand:.0f}, trainwell {total_ours:.0f} "
             f"(+{total_ours - total_hand:.0f}, ratio {total_hand / total_ours:.3f})", "",
             f"{'trainwell':>10}{'hand':>8}  function (largest differences)"]
    names = sorted(set(hand) | set(ours), key=lambda n: -abs(ours.get(n, 0) - hand.get(n, 0)))
    lines += [f"{ours.get(n, 0):>10.0f}{hand.get(n, 0):>8.0f}  {n}" for n in names[:top]]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- report


def run_benchmark(cfg: BenchConfig) -> dict[str, Any]:
    """Interleaved rounds of every runner, the weight comparison and the import timings."""
    torch.set_num_threads(cfg.threads)
    data = dataset_for(cfg)
    runners: dict[str, Callable[..., float]] = {"hand loop": run_hand, "trainwell": run_trainwell}
    if has_transformers():
        runners["transformers"] = run_transformers
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in runners}
    losses: dict[str, float] = {}
    models: dict[str, MLP] = {}
    warm = replace(cfg, steps=10, warmup_steps=2)
    for runner in runners.values():  # untimed: first-call costs (lazy imports, allocator warm-up) for everyone
        timed(runner, warm, data)
    for _ in range(cfg.rounds):
        for name, runner in runners.items():
            took, loss, model = timed(runner, cfg, data)
            seconds[name].append(took[0])
            cpu_seconds[name].append(took[1])
            losses[name], models[name] = loss, model
    diff = max((a - b).abs().max().item() for a, b in zip(models["hand loop"].state_dict().values(),
                                                          models["trainwell"].state_dict().values()))
    return {"config": asdict(cfg), "seconds": seconds, "cpu_seconds": cpu_seconds, "losses": losses,
            "max_abs_weight_diff": diff}


def import_timings(repeats: int) -> dict[str, float | None]:
    """What ``from X import Trainer, TrainingArguments`` adds to ``import torch``, for trainwell and transformers."""
    imports = {"trainwell": import_overhead("from trainwell import Trainer, TrainingArguments", repeats)}
    if has_transformers():
        imports["transformers"] = import_overhead("from transformers import Trainer, TrainingArguments", repeats)
    return imports


def format_report(result: dict[str, Any]) -> str:
    """The table printed at the end (steps/s from wall time; the CPU-time ratio is steadier on a busy machine)."""
    cfg, seconds = result["config"], result["seconds"]
    best = {name: cfg["steps"] / min(times) for name, times in seconds.items()}
    median = {name: cfg["steps"] / statistics.median(times) for name, times in seconds.items()}
    cpu = {name: cfg["steps"] / min(times) for name, times in result["cpu_seconds"].items()}
    lines = [f"{BenchConfig(**cfg).describe()}, torch {torch.__version__}, {cfg['threads']} thread(s), "
             f"optim {cfg['optim']}, load average {os.getloadavg()[0]:.2f}", "",
             f"{'runner':<14}{'steps/s best':>13}{'steps/s median':>16}{'ratio best':>12}{'ratio median':>14}"
             f"{'ratio cpu':>11}{'train loss':>12}"]
    for name in seconds:
        lines.append(f"{name:<14}{best[name]:>13.1f}{median[name]:>16.1f}{best[name] / best['hand loop']:>12.3f}"
                     f"{median[name] / median['hand loop']:>14.3f}{cpu[name] / cpu['hand loop']:>11.3f}"
                     f"{result['losses'][name]:>12.6f}")
    lines += [f"max |weight difference| hand loop vs trainwell: {result['max_abs_weight_diff']:.3e}"]
    if "transformers" not in seconds:
        lines.append("(transformers or accelerate is not installed: its runner was skipped)")
    return "\n".join(lines)


def format_imports(imports: dict[str, float | None], repeats: int) -> str:
    """The import timings, one line each."""
    return "\n".join(f"import time added to `import torch` by `from {name} import Trainer, TrainingArguments`: "
                     f"{'failed' if value is None else f'{value:.3f} s'} (median of {repeats})"
                     for name, value in imports.items())


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--case``, ``--quick``, ``--steps``, ``--rounds``, ``--threads``, ``--json PATH``,
    ``--opcodes``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append",
                        help="the case to run (repeatable; default: every case)")
    parser.add_argument("--quick", action="store_true", help="a quarter of each case's steps, 2 rounds")
    parser.add_argument("--steps", type=int, help="optimizer steps per run (default: the case's)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default: the case's)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--json", type=Path, help="also write the raw results to this json file")
    parser.add_argument("--optim", default="adamw_torch", choices=("adamw_torch", "adamw_torch_fused"),
                        help="the optimizer of every runner (default adamw_torch; the hand loop passes fused=True "
                             "for adamw_torch_fused)")
    parser.add_argument("--opcodes", action="store_true",
                        help="count Python bytecodes per step instead of timing (deterministic)")
    ns = parser.parse_args(argv)
    cases = ns.case or list(CASES)
    if ns.opcodes:
        print("\n\n".join(opcode_report(case) for case in cases))
        return 0
    results: dict[str, Any] = {}
    repeats = 3 if ns.quick else BenchConfig.import_repeats
    for case in cases:
        cfg = replace(CASES[case], threads=ns.threads, optim=ns.optim, import_repeats=repeats)
        if ns.quick:
            cfg = replace(cfg, steps=max(cfg.steps // 4, 16), rounds=2)
        cfg = replace(cfg, steps=ns.steps or cfg.steps, rounds=ns.rounds or cfg.rounds)
        results[case] = run_benchmark(cfg)
        print(f"[{case}] {format_report(results[case])}\n", flush=True)
    imports = import_timings(repeats)
    print(format_imports(imports, repeats))
    print("\nratio = steps/s of the runner / steps/s of the hand loop (ratio cpu: from process CPU time); each "
          "time covers a whole train() call")
    if ns.json:
        ns.json.write_text(json.dumps({"cases": results, "import_seconds": imports}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
