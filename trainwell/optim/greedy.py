"""GreedyLR (``lr_scheduler_type="greedy"``): a learning rate that follows the evaluation metric.

Upstream's adaptive schedule (transformers 5.2x, https://arxiv.org/abs/2512.14527): after more than ``patience``
evaluations that improve on the best metric the rate is divided by ``factor`` (capped at ``max_lr``); after more
than ``patience`` evaluations without improvement it is multiplied by ``factor`` (floored at ``min_lr``). A
``cooldown`` (after a decrease) or ``warmup`` (after an increase) of evaluations follows each change, during which
nothing is counted. Once every group sits at ``min_lr``, ``reset_start`` more decreases bring the initial rates, the
best metric and the counters back. ``smooth=True`` compares the mean of the last ``window_size`` metrics instead.

Like ``ReduceLROnPlateau``, it steps on the evaluation metric (``metric_for_best_model``), not every optimizer
step. Its ``state_dict()`` has upstream's keys, so ``scheduler.pt`` files interchange.
"""

from __future__ import annotations

from typing import Any

from torch.optim import Optimizer

__all__ = ["GreedyLR", "StreamingAverage", "get_greedy_schedule"]


class StreamingAverage:
    """Mean of the last ``window_size`` values given to :meth:`streamavg`."""

    def __init__(self, window_size: int) -> None:
        self.window_size = window_size
        self.values: list[float] = []
        self.sum = 0.0

    def streamavg(self, value: float) -> float:
        """Add ``value`` and return the mean of the window (the oldest value leaves once it is full)."""
        self.values.append(value)
        self.sum += value
        if len(self.values) > self.window_size:
            self.sum -= self.values.pop(0)
        return self.sum / len(self.values)

    def state_dict(self) -> dict[str, Any]:
        """``window_size``, ``values`` and ``sum``."""
        return {"window_size": self.window_size, "values": list(self.values), "sum": self.sum}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.window_size = state_dict.get("window_size", self.window_size)
        self.values = list(state_dict.get("values", []))
        self.sum = state_dict.get("sum", 0.0)


def _per_group(value: float | list[float], optimizer: Optimizer, name: str) -> list[float]:
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"GreedyLR: expected {groups} {name}s (one per parameter group), got {len(value)}")
        return list(value)
    return [value] * groups


# Saved by state_dict() (upstream's keys and order); the streaming average is added when smoothing.
_STATE_KEYS = ("factor", "min_lrs", "max_lrs", "patience", "verbose", "cooldown", "warmup", "cooldown_counter",
               "warmup_counter", "mode", "threshold", "threshold_mode", "best", "num_bad_epochs", "num_good_epochs",
               "eps", "last_epoch", "smooth", "window_size", "reset_start", "reset_start_original", "_last_lr",
               "_init_lrs")


class GreedyLR:
    """Raise the learning rate while the metric keeps improving, lower it when it stalls (see the module doc).

    Args (upstream's, same defaults): ``optimizer``; ``mode`` ("min" or "max"); ``factor`` (< 1); ``patience``;
    ``threshold`` and ``threshold_mode`` ("abs" or "rel"); ``cooldown``; ``warmup``; ``min_lr`` and ``max_lr``
    (a number, or one per parameter group); ``eps`` (smallest change applied); ``verbose``; ``smooth`` and
    ``window_size``; ``reset_start``. Call ``step(metric)`` after each evaluation.
    """

    def __init__(self, optimizer: Optimizer, mode: str = "min", factor: float = 0.95, patience: int = 10,
                 threshold: float = 1e-6, threshold_mode: str = "abs", cooldown: int = 0, warmup: int = 0,
                 min_lr: float | list[float] = 1e-3, max_lr: float | list[float] = 1.0, eps: float = 1e-8,
                 verbose: bool = False, smooth: bool = False, window_size: int = 50, reset_start: int = 500) -> None:
        if factor >= 1.0:
            raise ValueError(f"GreedyLR: factor={factor} must be < 1.0 (the rate is multiplied by it on a plateau).")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"GreedyLR needs a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if mode not in ("min", "max"):
            raise ValueError(f"GreedyLR: mode={mode!r} is unknown; use 'min' or 'max'.")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(f"GreedyLR: threshold_mode={threshold_mode!r} is unknown; use 'rel' or 'abs'.")
        self.optimizer = optimizer
        self.mode, self.factor, self.patience, self.verbose = mode, factor, patience, verbose
        self.threshold, self.threshold_mode, self.eps = threshold, threshold_mode, eps
        self.cooldown, self.warmup = cooldown, warmup
        self.cooldown_counter = self.warmup_counter = 0
        self.smooth, self.window_size = smooth, window_size
        self.reset_start = self.reset_start_original = reset_start
        self.last_epoch = 0
        self.min_lrs = _per_group(min_lr, optimizer, "min_lr")
        self.max_lrs = _per_group(max_lr, optimizer, "max_lr")
        self._init_lrs = [group["lr"] for group in optimizer.param_groups]
        self._last_lr = list(self._init_lrs)
        self.best = self._worst()
        self.num_bad_epochs = self.num_good_epochs = 0
        self._streaming_avg: StreamingAverage | None = StreamingAverage(window_size) if smooth else None

    def _worst(self) -> float:
        return float("inf") if self.mode == "min" else float("-inf")

    def step(self, metrics: float, epoch: int | None = None) -> None:
        """Count ``metrics`` (one evaluation's value) as an improvement or not, and move the rate when due."""
        current = float(metrics)
        if self._streaming_avg is not None and self.smooth:
            current = self._streaming_avg.streamavg(current)
        self.last_epoch = epoch = self.last_epoch + 1 if epoch is None else epoch
        if self.cooldown_counter > 0 or self.warmup_counter > 0:
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
            else:
                self.warmup_counter -= 1
            self.num_bad_epochs = self.num_good_epochs = 0
        else:
            self._count(current)
            if self.num_good_epochs > self.patience:
                self._increase_lr(epoch)
                self.warmup_counter, self.num_good_epochs = self.warmup, 0
            elif self.num_bad_epochs > self.patience:
                self._reduce_lr(epoch)
                self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _count(self, current: float) -> None:
        if self.is_better(current, self.best):
            self.best, self.num_bad_epochs = current, 0
            self.num_good_epochs += 1
        else:
            self.num_bad_epochs += 1
            self.num_good_epochs = 0

    def is_better(self, current: float, best: float) -> bool:
        """Whether ``current`` improves on ``best`` by more than the threshold."""
        sign = 1.0 if self.mode == "min" else -1.0
        if self.threshold_mode == "rel":
            return sign * current < sign * best * (1.0 - sign * self.threshold)
        return sign * current < sign * best - self.threshold

    def _reduce_lr(self, epoch: int) -> None:
        all_at_min = True
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new
                self._say(f"Epoch {epoch}: reducing learning rate of group {i} to {new:.4e}.")
            all_at_min = all_at_min and not group["lr"] > self.min_lrs[i]
        if all_at_min:
            self.reset_start -= 1
            if self.reset_start <= 0:
                self._reset()

    def _increase_lr(self, epoch: int) -> None:
        for i, group in enumerate(self.optimizer.param_groups):
            old = float(group["lr"])
            new = min(old / self.factor, self.max_lrs[i])
            if new - old > self.eps:
                group["lr"] = new
                self._say(f"Epoch {epoch}: increasing learning rate of group {i} to {new:.4e}.")
        self.reset_start = self.reset_start_original

    def _reset(self) -> None:
        for group, lr in zip(self.optimizer.param_groups, self._init_lrs):
            group["lr"] = lr
        self.best = self._worst()
        self.num_bad_epochs = self.num_good_epochs = self.cooldown_counter = self.warmup_counter = 0
        self.reset_start = self.reset_start_original
        if self.smooth and self._streaming_avg is not None:
            self._streaming_avg = StreamingAverage(self.window_size)
        self._say("Scheduler reset to initial state.")

    def _say(self, message: str) -> None:
        if self.verbose:
            print(message)

    def get_last_lr(self) -> list[float]:
        """The rates after the last :meth:`step` (the initial ones before any)."""
        return self._last_lr

    def state_dict(self) -> dict[str, Any]:
        """Every setting and counter under upstream's keys (plus ``_streaming_avg`` when smoothing)."""
        state = {key: getattr(self, key) for key in _STATE_KEYS}
        if self.smooth and self._streaming_avg is not None:
            state["_streaming_avg"] = self._streaming_avg.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s values (missing keys keep theirs) and put ``_last_lr`` on the optimizer."""
        for key in _STATE_KEYS:
            setattr(self, key, state_dict.get(key, getattr(self, key)))
        if "_streaming_avg" in state_dict:
            if self._streaming_avg is None:
                self._streaming_avg = StreamingAverage(self.window_size)
            self._streaming_avg.load_state_dict(state_dict["_streaming_avg"])
        if "_last_lr" in state_dict:
            for group, lr in zip(self.optimizer.param_groups, self._last_lr):
                group["lr"] = lr


def get_greedy_schedule(optimizer: Optimizer, **kwargs: Any) -> GreedyLR:
    """A :class:`GreedyLR` for ``optimizer`` (``kwargs``: its arguments, from ``lr_scheduler_kwargs``)."""
    return GreedyLR(optimizer, **kwargs)
