"""Human-readable metrics: the ``metrics_format`` / ``log_metrics`` / ``save_metrics`` helpers of the Trainer."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def metrics_format(metrics: dict[str, float]) -> dict[str, Any]:
    """Runtimes as ``h:mm:ss.ss``, memory deltas in MB, ``total_flos`` in GF, other floats rounded to 4 digits."""
    out: dict[str, Any] = {}
    for key, value in metrics.copy().items():
        if "_mem_" in key:
            out[key] = f"{value >> 20}MB" if isinstance(value, int) else value
        elif "_runtime" in key:
            seconds = float(value)
            out[key] = f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}:{seconds % 60:05.2f}"
        elif key == "total_flos":
            out[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, float):
            out[key] = round(value, 4)
        else:
            out[key] = value
    return out


def format_metrics_table(split: str, metrics: dict[str, float]) -> str:
    """The text block ``log_metrics`` prints: a header line then one aligned ``key = value`` line per metric."""
    formatted = metrics_format(metrics)
    width = max((len(k) for k in formatted), default=0)
    lines = [f"***** {split} metrics *****"]
    lines += [f"  {key: <{width}} = {formatted[key]:>9}" for key in sorted(formatted)]
    return "\n".join(lines)


def save_metrics_json(output_dir: str, split: str, metrics: dict[str, float], *, combined: bool = True) -> None:
    """Write ``{split}_results.json`` (or ``all_results.json`` for split "all") and merge into ``all_results.json``."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, f"{split}_results.json")
    with open(path, "w") as fh:
        json.dump(metrics, fh, indent=4, sort_keys=True)
    if combined:
        all_path = os.path.join(output_dir, "all_results.json")
        merged: dict[str, Any] = {}
        if os.path.exists(all_path):
            with open(all_path) as fh:
                merged = json.load(fh)
        merged.update(metrics)
        with open(all_path, "w") as fh:
            json.dump(merged, fh, indent=4, sort_keys=True)


def speed_metrics(split: str, start_time: float, num_samples: float | None = None, num_steps: int | None = None,
                  num_tokens: int | None = None) -> dict[str, float]:
    """``{split}_runtime``, ``_samples_per_second``, ``_steps_per_second`` (and tokens) since ``start_time``."""
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime == 0:
        return result
    if num_samples is not None:
        result[f"{split}_samples_per_second"] = round(num_samples / runtime, 3)
    if num_steps is not None:
        result[f"{split}_steps_per_second"] = round(num_steps / runtime, 3)
    if num_tokens is not None:
        result[f"{split}_tokens_per_second"] = round(num_tokens / runtime, 3)
    return result
