"""Does ``Trainer.predict`` scale linearly? Time and peak memory on 100, 200, 400 and 800 batches.

A tiny model returns logits of shape ``[batch, seq_len_i, vocab]`` whose ``seq_len_i`` changes from batch to
batch (16..96), so every output must be padded with -100 before it is concatenated. For each size, a fresh
subprocess runs ``predict()`` and reports the time per batch (best of 3 runs) and the peak RSS growth during
the first run (sampled by a thread) against the ``nbytes`` of the returned arrays.

Targets: per-batch time at 800 batches within 1.3x of that at 100; peak RSS growth within 1.5x of the arrays.
The same figures are printed for ``transformers.Trainer`` when it is installed.

    python bench/predict_scaling.py            # all sizes, trainwell (+ transformers if importable)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

SIZES = (100, 200, 400, 800)
BATCH, VOCAB, MIN_LEN, MAX_LEN = 8, 64, 16, 96


def seq_len(batch_index: int) -> int:
    """Sequence length of a batch: cycles through 16..96 (96 is reached within the first 81 batches)."""
    return MIN_LEN + (batch_index * 37) % (MAX_LEN - MIN_LEN + 1)


def make_dataset(num_batches: int):
    """Items generated on the fly; the length is constant inside a batch so default collation works."""
    import torch

    class Ragged(torch.utils.data.Dataset):
        """``num_batches * BATCH`` token sequences, ragged across batches."""

        def __len__(self) -> int:
            return num_batches * BATCH

        def __getitem__(self, i: int) -> dict:
            length = seq_len(i // BATCH)
            ids = (torch.arange(length) * (i + 1)) % VOCAB
            return {"input_ids": ids, "labels": (ids + 1) % VOCAB}

    return Ragged()


def make_model():
    """Embedding -> logits over VOCAB, with a cross-entropy loss when labels are given."""
    import torch
    from torch import nn

    class Tiny(nn.Module):
        """One embedding table used as the logits."""

        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(VOCAB, VOCAB)

        def forward(self, input_ids, labels=None):
            """``{"logits": [batch, seq, VOCAB]}`` plus ``"loss"`` when labels are given."""
            logits = self.emb(input_ids)
            out = {"logits": logits}
            if labels is not None:
                out["loss"] = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
            return out

    torch.manual_seed(0)
    return Tiny()


def build_trainer(impl: str, model, out_dir: str):
    """A ``trainwell`` or ``transformers`` Trainer set up for CPU prediction with no reporting."""
    if impl == "transformers":
        from transformers import Trainer, TrainingArguments
    else:
        from trainwell import Trainer, TrainingArguments
    args = TrainingArguments(output_dir=out_dir, per_device_eval_batch_size=BATCH, report_to="none", use_cpu=True,
                             skip_memory_metrics=True, disable_tqdm=True, dataloader_num_workers=0)
    return Trainer(model=model, args=args)


class PeakRSS:
    """Samples the process's RSS every millisecond in a thread; ``peak`` is the highest value seen."""

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def worker(impl: str, num_batches: int) -> dict:
    """One size, in this (fresh) process: memory on the first run, best time of three."""
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = build_trainer(impl, make_model(), out_dir)
        trainer.predict(make_dataset(4))  # warm-up: first-call costs are not part of the scaling
        dataset = make_dataset(num_batches)
        gc.collect()
        import psutil

        before = psutil.Process().memory_info().rss
        start = time.perf_counter()
        with PeakRSS() as rss:
            output = trainer.predict(dataset)
        times = [time.perf_counter() - start]
        nbytes = output.predictions.nbytes + output.label_ids.nbytes
        assert output.predictions.shape == (num_batches * BATCH, MAX_LEN, VOCAB), output.predictions.shape
        del output
        for _ in range(2):
            gc.collect()
            start = time.perf_counter()
            trainer.predict(dataset)
            times.append(time.perf_counter() - start)
    return {"batches": num_batches, "per_batch_ms": 1000 * min(times) / num_batches,
            "rss_growth_mb": (rss.peak - before) / 2**20, "arrays_mb": nbytes / 2**20}


def run_size(impl: str, num_batches: int) -> dict:
    """Run :func:`worker` in a fresh interpreter and parse its JSON line."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", impl, "--batches",
                           str(num_batches)], capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"{impl} worker for {num_batches} batches failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(impl: str) -> bool:
    """Print the table and the two ratios for one implementation; True when both targets are met."""
    rows = [run_size(impl, n) for n in SIZES]
    print(f"\n== {impl}.Trainer.predict: batch {BATCH}, seq 16..96 (ragged), vocab {VOCAB}")
    print(f"{'batches':>8} {'ms/batch':>9} {'peak RSS growth MB':>19} {'arrays MB':>10} {'growth/arrays':>14}")
    for row in rows:
        ratio = row["rss_growth_mb"] / row["arrays_mb"]
        print(f"{row['batches']:>8} {row['per_batch_ms']:>9.3f} {row['rss_growth_mb']:>19.1f} "
              f"{row['arrays_mb']:>10.1f} {ratio:>14.2f}")
    time_ratio = rows[-1]["per_batch_ms"] / rows[0]["per_batch_ms"]
    memory_ratio = rows[-1]["rss_growth_mb"] / rows[-1]["arrays_mb"]
    time_ok, memory_ok = time_ratio <= 1.3, memory_ratio <= 1.5
    print(f"per-batch time ratio 800/100: {time_ratio:.2f} (target <= 1.3: {'ok' if time_ok else 'MISSED'})")
    print(f"peak RSS growth / arrays at 800: {memory_ratio:.2f} (target <= 1.5: {'ok' if memory_ok else 'MISSED'})")
    return time_ok and memory_ok


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def main() -> int:
    """Parse the command line; run one worker or the whole benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=("trainwell", "transformers"))
    parser.add_argument("--batches", type=int, default=100)
    options = parser.parse_args()
    if options.worker:
        print(json.dumps(worker(options.worker, options.batches)))
        return 0
    ok = report("trainwell")
    if _importable("transformers") and _importable("accelerate"):  # transformers.Trainer needs accelerate
        report("transformers")
    else:
        print("\n(transformers or accelerate is not installed: no comparison)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
