"""Resuming a stream: the time from ``train()`` to the first step after a resume, trainwell beside upstream
``transformers.Trainer`` in the same run, at several positions of the stream.

The stream is a toy ``torch.utils.data.IterableDataset`` that sleeps ``--sleep-ms`` (1 ms) per example (a stand-in
for reading and decoding) and can say its position (``state_dict()`` / ``load_state_dict()``). A tiny regression
model trains on batches of ``--batch`` (4), one process, no workers. For each side, one run trains to the largest
position and saves a checkpoint at every position (the stream does not sleep while the checkpoints are made); then,
for each position, a fresh Trainer over a fresh stream (sleeping) resumes from that checkpoint and trains one step.

Reported per side and position: ``seconds_to_first_step`` (from the ``train()`` call to the end of the first step:
the checkpoint's load, reaching the position, one step), ``examples_read`` (what the stream produced until then)
and ``how`` (``restored``: the saved position was loaded; ``re-read``: the consumed batches were read and dropped).
trainwell restores the position; upstream re-reads (accelerate's ``skip_first_batches``), so its time grows with
the position.

    python bench/stream_resume.py --json stream_resume.json      # positions 100, 1,000, 10,000: a few minutes
    python bench/stream_resume.py --quick --json out.json         # smoke test: positions 10 and 40
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

SIDES = ("trainwell", "upstream")


class SleepyStream(torch.utils.data.IterableDataset):
    """An endless stream of deterministic rows, ``sleep_s`` per row; ``produced`` counts the rows it made."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s, self.next_index, self.produced = sleep_s, 0, 0

    def __iter__(self):
        while True:
            i = self.next_index
            self.next_index += 1
            self.produced += 1
            if self.sleep_s:
                time.sleep(self.sleep_s)
            yield {"x": torch.tensor([(i % 7) / 7.0, 1.0]), "labels": torch.tensor((i % 5) / 5.0)}

    def state_dict(self) -> dict[str, int]:
        """The index of the next row."""
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at the saved index."""
        self.next_index = state["next_index"]


class Regressor(nn.Module):
    """``y = w.x + b`` with a mean squared error."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        pred = self.linear(x).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}


def _library(side: str) -> Any:
    if side == "trainwell":
        import trainwell as lib
    else:
        import transformers as lib
    return lib


def _callbacks(lib: Any, positions: set[int], first_step: list[float]) -> list[Any]:
    class SaveAt(lib.TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if state.global_step in positions:
                control.should_save = True
            if not first_step:
                first_step.append(time.perf_counter())
            return control

    return [SaveAt()]


def _trainer(lib: Any, out: str, stream: SleepyStream, max_steps: int, positions: set[int],
             first_step: list[float], batch: int) -> Any:
    args = lib.TrainingArguments(output_dir=out, max_steps=max_steps, per_device_train_batch_size=batch,
                                 learning_rate=0.01, save_strategy="steps", save_steps=10 ** 9, report_to="none",
                                 disable_tqdm=True, use_cpu=True, remove_unused_columns=False, logging_steps=10 ** 9,
                                 dataloader_pin_memory=False, seed=0)
    torch.manual_seed(0)
    return lib.Trainer(model=Regressor(), args=args, train_dataset=stream,
                       callbacks=_callbacks(lib, positions, first_step))


def run_side(side: str, positions: list[int], *, sleep_s: float, batch: int, workdir: Path) -> list[dict[str, Any]]:
    """Checkpoints at every position, then one resume from each: a row per position."""
    lib = _library(side)
    out = str(workdir / side)
    _trainer(lib, out, SleepyStream(0.0), max(positions), set(positions), [], batch).train()
    rows = []
    for position in positions:
        stream, first_step = SleepyStream(sleep_s), []
        trainer = _trainer(lib, out + f"-resume-{position}", stream, position + 1, set(), first_step, batch)
        start = time.perf_counter()
        trainer.train(resume_from_checkpoint=os.path.join(out, f"checkpoint-{position}"))
        consumed = position * batch
        rows.append({"side": side, "position": position, "seconds_to_first_step": round(first_step[0] - start, 3),
                     "examples_read": stream.produced,
                     "how": "re-read" if stream.produced > consumed else "restored"})
    return rows


def run(positions: list[int], *, sleep_s: float, batch: int, sides: tuple[str, ...] = SIDES) -> dict[str, Any]:
    """Every side at every position; the result as the json file holds it."""
    for name in ("trainwell", "transformers", "accelerate"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="stream-resume-") as tmp:
        rows = [row for side in sides for row in run_side(side, positions, sleep_s=sleep_s, batch=batch,
                                                          workdir=Path(tmp))]
    return {"config": {"positions": positions, "sleep_ms": sleep_s * 1000, "batch": batch, "sides": list(sides),
                       "torch": torch.__version__, "python": platform.python_version()},
            "load_average": list(os.getloadavg()), "rows": rows}


def format_report(result: dict[str, Any]) -> str:
    """A markdown table: one line per position, the sides beside each other."""
    rows = {(r["side"], r["position"]): r for r in result["rows"]}
    sides = result["config"]["sides"]
    head = "| position (steps) | " + " | ".join(f"{s}: s to first step (examples read)" for s in sides) + " |"
    lines = [head, "|" + "---|" * (len(sides) + 1)]
    for position in result["config"]["positions"]:
        cells = [f"{rows[s, position]['seconds_to_first_step']:.2f} ({rows[s, position]['examples_read']:,}, "
                 f"{rows[s, position]['how']})" for s in sides]
        lines.append(f"| {position:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--sleep-ms", type=float, default=1.0, help="the stream's time per example")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--quick", action="store_true", help="smoke test: positions 10 and 40")
    parser.add_argument("--json", type=Path, help="also write the results to this json file")
    ns = parser.parse_args(argv)
    positions = [10, 40] if ns.quick else sorted(set(ns.positions))
    result = run(positions, sleep_s=ns.sleep_ms / 1000, batch=ns.batch, sides=tuple(ns.sides))
    print(format_report(result))
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
