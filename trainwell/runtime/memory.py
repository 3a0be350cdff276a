"""Memory metrics of the Trainer's stages: ``init_mem_*``, ``train_mem_*``, ``eval_mem_*``, ``test_mem_*``.

CPU numbers are the process's RSS (psutil), with the peak caught by a sampling thread; GPU numbers come from
the CUDA allocator (``memory_allocated`` / ``max_memory_allocated``) when CUDA is present. Only the outermost
stage is tracked: an ``evaluate`` inside ``train`` is accounted to ``train`` (the CUDA peak counter is global,
so nested stages cannot be measured separately). The ``init`` numbers are added to the first metrics update.
"""

from __future__ import annotations

import gc
import inspect
import threading
from typing import Any

import torch

# The caller's function name -> stage name.
STAGES = {
    "__init__": "init",
    "train": "train",
    "_inner_training_loop": "train",
    "run_training": "train",
    "evaluate": "eval",
    "predict": "test",
}

_SAMPLE_INTERVAL_S = 0.002  # upstream busy-loops; a short sleep keeps a shared CPU free at little cost in accuracy


class TrainerMemoryTracker:
    """Measures CPU (and GPU) memory deltas of ``__init__``, ``train``, ``evaluate`` and ``predict``.

    Usage, inside one of those methods: ``tracker.start()`` first, ``tracker.stop_and_update_metrics(metrics)``
    last; the stage is derived from the caller's name. Adds ``{stage}_mem_cpu_alloc_delta`` (end - start, may be
    negative) and ``{stage}_mem_cpu_peaked_delta`` (peak above the end, never negative), and the ``gpu`` pair
    when CUDA is available. ``skip_memory_metrics=True`` (or psutil missing) makes every method a no-op.
    """

    def __init__(self, skip_memory_metrics: bool = False) -> None:
        self.skip_memory_metrics = skip_memory_metrics
        if not skip_memory_metrics:
            try:
                import psutil
            except ImportError:  # the metrics are optional: no psutil, no memory report
                self.skip_memory_metrics = True
        if self.skip_memory_metrics:
            return

        self.torch = torch if torch.cuda.is_available() else None
        self.process = psutil.Process()
        self.cur_stage: str | None = None
        self.cpu: dict[str, dict[str, int]] = {}
        self.gpu: dict[str, dict[str, int]] = {}
        self.init_reported = False
        self._peak = -1
        self._monitoring = threading.Event()
        self._thread: threading.Thread | None = None

    def derive_stage(self) -> str:
        """The stage of the method that called ``start``/``stop_and_update_metrics`` (two frames up)."""
        frame = inspect.currentframe()
        caller = frame.f_back.f_back.f_code.co_name if frame and frame.f_back and frame.f_back.f_back else ""
        if caller not in STAGES:
            raise ValueError(f"TrainerMemoryTracker was called from {caller!r}; it can only be called from "
                             f"{sorted(STAGES)} (or pass the stage explicitly: one of {sorted(set(STAGES.values()))}).")
        return STAGES[caller]

    def cpu_mem_used(self) -> int:
        """The process's resident set size in bytes."""
        return self.process.memory_info().rss

    def _sample_peak(self) -> None:
        while True:
            self._peak = max(self.cpu_mem_used(), self._peak)
            if self._monitoring.wait(_SAMPLE_INTERVAL_S):
                self._peak = max(self.cpu_mem_used(), self._peak)
                return

    def start(self, stage: str | None = None) -> None:
        """Begin measuring the caller's stage; ignored while another (outer) stage is being measured."""
        if self.skip_memory_metrics:
            return
        stage = stage or self.derive_stage()
        if self.cur_stage is not None and self.cur_stage != stage:
            return  # nested: eval inside train is accounted to train
        self.cur_stage = stage
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.reset_peak_memory_stats()
            self.torch.cuda.empty_cache()
            self.gpu_mem_used_at_start = self.torch.cuda.memory_allocated()
        self.cpu_mem_used_at_start = self.cpu_mem_used()
        self._peak = -1
        self._monitoring.clear()
        self._thread = threading.Thread(target=self._sample_peak, name="trainwell-memory-peak", daemon=True)
        self._thread.start()

    def stop(self, stage: str) -> None:
        """Finish measuring ``stage`` (ignored when ``stage`` is not the one being measured)."""
        if self.skip_memory_metrics or self.cur_stage is None or self.cur_stage != stage:
            return
        self._monitoring.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.empty_cache()
            now, peak = self.torch.cuda.memory_allocated(), self.torch.cuda.max_memory_allocated()
            self.gpu[stage] = {"begin": self.gpu_mem_used_at_start, "end": now,
                               "alloc": now - self.gpu_mem_used_at_start, "peaked": max(0, peak - now)}
        now = self.cpu_mem_used()
        self.cpu[stage] = {"begin": self.cpu_mem_used_at_start, "end": now,
                           "alloc": now - self.cpu_mem_used_at_start, "peaked": max(0, self._peak - now)}
        self.cur_stage = None

    def update_metrics(self, stage: str, metrics: dict[str, Any]) -> None:
        """Add ``stage``'s numbers (and, the first time, ``init``'s) to ``metrics``."""
        if self.skip_memory_metrics or (self.cur_stage is not None and self.cur_stage != stage):
            return
        stages = [stage]
        if not self.init_reported:
            stages.insert(0, "init")
            self.init_reported = True
        for name in stages:
            for kind in ("alloc", "peaked"):
                if kind in self.cpu.get(name, {}):
                    metrics[f"{name}_mem_cpu_{kind}_delta"] = self.cpu[name][kind]
                if self.torch is not None and kind in self.gpu.get(name, {}):
                    metrics[f"{name}_mem_gpu_{kind}_delta"] = self.gpu[name][kind]
        if stages[0] == "init" and "init" in self.cpu:
            metrics["before_init_mem_cpu"] = self.cpu["init"]["begin"]
            if self.torch is not None and "init" in self.gpu:
                metrics["before_init_mem_gpu"] = self.gpu["init"]["begin"]

    def stop_and_update_metrics(self, metrics: dict[str, Any] | None = None, stage: str | None = None) -> None:
        """``stop`` the caller's stage and add its numbers to ``metrics`` (when given)."""
        if self.skip_memory_metrics:
            return
        stage = stage or self.derive_stage()
        self.stop(stage)
        if metrics is not None:
            self.update_metrics(stage, metrics)
