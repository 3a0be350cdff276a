"""Tests of TrainerMemoryTracker (trainwell.runtime.memory)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trainwell.runtime.memory import TrainerMemoryTracker

MB = 2**20


class Host:
    """Calls the tracker from methods named like the Trainer's, since the stage comes from the caller's name."""

    def __init__(self, skip: bool = False, init_alloc_mb: int = 0) -> None:
        self.tracker = TrainerMemoryTracker(skip)
        self.tracker.start()
        self.kept = np.ones(init_alloc_mb * MB, np.uint8) if init_alloc_mb else None
        self.tracker.stop_and_update_metrics()

    def train(self, nested_eval: bool = False, spike_mb: int = 0) -> dict:
        self.tracker.start()
        metrics: dict = {}
        if spike_mb:
            spike = np.ones(spike_mb * MB, np.uint8)  # touched pages: counted in RSS
            time.sleep(0.3)  # leave the sampling thread (every 2 ms) ample time to see it, even on a busy machine
            del spike
        if nested_eval:
            metrics["nested"] = self.evaluate()
        self.tracker.stop_and_update_metrics(metrics)
        return metrics

    def evaluate(self) -> dict:
        self.tracker.start()
        metrics: dict = {}
        self.tracker.stop_and_update_metrics(metrics)
        return metrics

    def predict(self) -> dict:
        self.tracker.start()
        metrics: dict = {}
        self.tracker.stop_and_update_metrics(metrics)
        return metrics


@pytest.mark.slow  # over a second
def test_keys_and_init_reported_once_on_first_update():
    host = Host()
    first = host.evaluate()
    assert {"init_mem_cpu_alloc_delta", "init_mem_cpu_peaked_delta", "eval_mem_cpu_alloc_delta",
            "eval_mem_cpu_peaked_delta", "before_init_mem_cpu"} <= set(first)
    second = host.predict()
    assert {"test_mem_cpu_alloc_delta", "test_mem_cpu_peaked_delta"} <= set(second)
    assert not any(key.startswith("init_") for key in second)
    assert all(isinstance(first[key], int) for key in first)
    assert first["init_mem_cpu_peaked_delta"] >= 0 and second["test_mem_cpu_peaked_delta"] >= 0


@pytest.mark.slow
def test_alloc_delta_and_peak_are_measured():
    """Measured in a fresh interpreter: after a long test session the allocator may hand back memory the process
    already holds, and the resident size (what the tracker reads, as upstream's) does not grow."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from test_memory import Host; "
            "h = Host(init_alloc_mb=40); print(json.dumps(h.train(spike_mb=60)))")
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True, text=True,
                          timeout=120, check=True)
    metrics = json.loads(done.stdout.strip().splitlines()[-1])
    assert metrics["init_mem_cpu_alloc_delta"] >= 30 * MB  # the 40 MB kept by __init__
    assert metrics["train_mem_cpu_peaked_delta"] >= 40 * MB  # the 60 MB spike, freed before the end
    assert abs(metrics["train_mem_cpu_alloc_delta"]) < 20 * MB


@pytest.mark.slow  # over a second
def test_nested_eval_inside_train_is_ignored():
    host = Host()
    metrics = host.train(nested_eval=True)
    assert metrics["nested"] == {}
    assert "train_mem_cpu_alloc_delta" in metrics and "init_mem_cpu_alloc_delta" in metrics
    assert host.tracker.cur_stage is None
    # tracking works again after the outer stage ended
    assert "eval_mem_cpu_alloc_delta" in host.evaluate()


def test_skip_is_a_no_op():
    host = Host(skip=True)
    assert host.train() == {} and host.evaluate() == {} and host.predict() == {}
    assert not hasattr(host.tracker, "_thread")


@pytest.mark.slow  # over a second
def test_unknown_caller_is_an_error_naming_the_allowed_stages():
    tracker = TrainerMemoryTracker()

    def some_function():
        tracker.start()

    with pytest.raises(ValueError, match="some_function.*evaluate"):
        some_function()
    tracker.start(stage="eval")
    metrics: dict = {}
    tracker.stop_and_update_metrics(metrics, stage="eval")
    assert "eval_mem_cpu_alloc_delta" in metrics


@pytest.mark.slow  # over a second
def test_sampling_thread_stops():
    host = Host()
    host.evaluate()
    assert host.tracker._thread is None
