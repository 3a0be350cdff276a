"""``trainwell plot OUTPUT_DIR``: a PNG of a run's curves, read from its ``trainer_state.json``.

Panels (one per quantity that was logged, over the optimizer step): the loss (training loss as a line, every
``eval_*loss`` as points joined by a line), the learning rate, the gradient norm, then one panel per other
evaluation metric (accuracy, ...). Runtime and throughput entries are left out. For a run still in progress
(no ``trainer_state.json`` in ``OUTPUT_DIR`` yet), the newest checkpoint's state is used. Needs matplotlib
(``pip install 'trainwell[plot]'``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..arguments import CLIError, RaisingArgumentParser
# The checkpoint layout and matplotlib load when the command runs: `trainwell plot --help` stays light.

PLOT_FILE_NAME = "training_curves.png"
_SKIPPED_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second", "_model_preparation_time",
                     "_jit_compilation_time")
_TRAIN_PANELS = (("loss", "training loss"), ("learning_rate", "learning rate"), ("grad_norm", "gradient norm"))


def find_state_file(folder: str | Path) -> Path:
    """``folder/trainer_state.json``, else that of the newest ``checkpoint-<step>`` inside it."""
    from ...checkpoint.layout import TRAINER_STATE_NAME, list_resumable_checkpoints

    folder = Path(folder)
    if not folder.is_dir():
        raise CLIError(f"{folder}: no such folder; pass the output_dir of a run (e.g. trainwell-output)")
    if (folder / TRAINER_STATE_NAME).is_file():
        return folder / TRAINER_STATE_NAME
    for checkpoint in reversed(list_resumable_checkpoints(folder)):
        if (checkpoint / TRAINER_STATE_NAME).is_file():
            return checkpoint / TRAINER_STATE_NAME
    raise CLIError(f"{folder}: no {TRAINER_STATE_NAME} here nor in a checkpoint-<step> folder; pass the output_dir "
                   "of a run that has logged or saved at least once")


def collect_series(log_history: list[dict[str, Any]]) -> dict[str, tuple[list[float], list[float]]]:
    """``{metric: (steps, values)}`` of every plottable number of ``log_history``."""
    series: dict[str, tuple[list[float], list[float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        if not isinstance(step, (int, float)):
            continue
        for key, value in entry.items():
            if key in ("step", "epoch", "total_flos") or key.endswith(_SKIPPED_SUFFIXES) or key.startswith("train_"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            steps, values = series.setdefault(key, ([], []))
            steps.append(float(step))
            values.append(float(value))
    return series


def _panels(series: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """``(title, metric keys)`` per panel, in a fixed order: loss, learning rate, grad norm, eval metrics."""
    eval_losses = sorted(k for k in series if k.startswith("eval_") and k.endswith("loss"))
    panels = []
    if "loss" in series or eval_losses:
        panels.append(("loss", [k for k in ("loss",) if k in series] + eval_losses))
    panels += [(title, [key]) for key, title in _TRAIN_PANELS[1:] if key in series]
    used = {k for _, keys in panels for k in keys}
    panels += [(key.removeprefix("eval_").replace("_", " "), [key]) for key in sorted(series) if key not in used]
    return panels


def plot_run(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the PNG of the run in ``folder`` (default ``folder/training_curves.png``); returns its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CLIError("trainwell plot needs matplotlib: pip install 'trainwell[plot]' (or pip install matplotlib)"
                       ) from None
    state_file = find_state_file(folder)
    try:
        history = json.loads(state_file.read_text()).get("log_history") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise CLIError(f"{state_file}: not a readable trainer_state.json ({exc})") from None
    series = collect_series(history)
    panels = _panels(series)
    if not panels:
        raise CLIError(f"{state_file}: its log_history holds no logged value yet; plot again after the first "
                       "logging step (--logging_steps)")
    columns = 1 if len(panels) == 1 else 2
    rows = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(6.0 * columns, 3.4 * rows), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            steps, values = series[key]
            evaluated = key.startswith("eval_")
            ax.plot(steps, values, marker="o" if evaluated or len(steps) < 3 else None, markersize=4,
                    linestyle="--" if evaluated else "-", label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if len(keys) > 1:
            ax.legend()
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    last_step = max(max(steps) for steps, _ in series.values())
    figure.suptitle(f"{Path(folder).resolve().name}: {state_file.relative_to(Path(folder))}, up to step "
                    f"{int(last_step)}")
    figure.tight_layout()
    out_path = Path(out) if out is not None else Path(folder) / PLOT_FILE_NAME
    out_path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_path, dpi=100)
    plt.close(figure)
    return out_path


def run(argv: list[str]) -> int:
    """``trainwell plot OUTPUT_DIR [--out FILE.png]``."""
    parser = RaisingArgumentParser(
        prog="trainwell plot",
        description="Draw the loss, learning rate, gradient norm and eval metrics of a run as a PNG.")
    parser.add_argument("output_dir", help="the run's output_dir (or one checkpoint-<step> folder)")
    parser.add_argument("--out", default=None, help=f"the PNG to write (default: OUTPUT_DIR/{PLOT_FILE_NAME})")
    ns = parser.parse_args(argv)
    path = plot_run(ns.output_dir, ns.out)
    print(f"wrote {path}")
    return 0
