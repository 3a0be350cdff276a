"""Tests for trainwell.optim.schedules: each schedule's lr sequence against its closed-form formula, resumption, errors."""

from __future__ import annotations

import math
import pickle

import pytest
import torch

from trainwell.optim import schedules
from trainwell.optim.greedy import GreedyLR
from trainwell.optim.schedules import (
    get_constant_schedule,
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_cosine_with_hard_restarts_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
    get_reduce_on_plateau_schedule,
    get_scheduler,
    get_wsd_schedule,
)
from trainwell.trainer_utils import SchedulerType

LR = 0.1
W, T, STEPS = 4, 16, 20


def _optimizer(lr: float = LR) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


def _lrs(scheduler, steps: int = STEPS) -> list[float]:
    """The learning rate used at steps 0..steps-1 (read before each ``scheduler.step()``)."""
    out = []
    for _ in range(steps):
        out.append(scheduler.optimizer.param_groups[0]["lr"])
        scheduler.optimizer.step()
        scheduler.step()
    return out


def _warm(s: int, w: int = W) -> float:
    return s / max(1, w)


def _prog(s: int) -> float:
    return (s - W) / max(1, T - W)


def _expected(formula) -> list[float]:
    return [LR * formula(s) for s in range(STEPS)]


def _check(scheduler, formula) -> None:
    assert _lrs(scheduler) == pytest.approx(_expected(formula), rel=1e-9, abs=1e-12)


def test_constant():
    _check(get_constant_schedule(_optimizer()), lambda s: 1.0)


def test_constant_with_warmup():
    _check(get_constant_schedule_with_warmup(_optimizer(), W), lambda s: _warm(s) if s < W else 1.0)


def test_linear_with_warmup():
    def formula(s):
        return _warm(s) if s < W else max(0.0, (T - s) / (T - W))

    lrs = _lrs(get_linear_schedule_with_warmup(_optimizer(), W, T))
    assert lrs == pytest.approx(_expected(formula), abs=1e-12)
    assert lrs[0] == 0.0 and lrs[W] == pytest.approx(LR) and lrs[T] == 0.0 and lrs[-1] == 0.0


@pytest.mark.parametrize("cycles", [0.5, 1.0])
def test_cosine_with_warmup(cycles):
    def formula(s):
        if s < W:
            return _warm(s)
        return max(0.0, 0.5 * (1 + math.cos(math.pi * cycles * 2 * _prog(s))))

    _check(get_cosine_schedule_with_warmup(_optimizer(), W, T, num_cycles=cycles), formula)


def test_cosine_with_hard_restarts():
    def formula(s):
        if s < W:
            return _warm(s)
        p = _prog(s)
        return 0.0 if p >= 1 else max(0.0, 0.5 * (1 + math.cos(math.pi * ((2 * p) % 1.0))))

    lrs = _lrs(get_cosine_with_hard_restarts_schedule_with_warmup(_optimizer(), W, T, num_cycles=2))
    assert lrs == pytest.approx(_expected(formula), abs=1e-12)
    assert lrs[W + (T - W) // 2] == pytest.approx(LR)  # the restart


def test_polynomial_decay():
    lr_end, power = 1e-3, 2.0

    def formula(s):
        if s < W:
            return _warm(s)
        if s > T:
            return lr_end / LR
        return ((LR - lr_end) * (1 - (s - W) / (T - W)) ** power + lr_end) / LR

    scheduler = get_polynomial_decay_schedule_with_warmup(_optimizer(), W, T, lr_end=lr_end, power=power)
    lrs = _lrs(scheduler)
    assert lrs == pytest.approx(_expected(formula), rel=1e-9)
    assert lrs[-1] == pytest.approx(lr_end)


def test_polynomial_lr_end_must_be_below_lr():
    with pytest.raises(ValueError, match="lr_end"):
        get_polynomial_decay_schedule_with_warmup(_optimizer(), W, T, lr_end=LR)


@pytest.mark.parametrize("timescale", [None, 8])
def test_inverse_sqrt(timescale):
    ts = timescale or W

    def formula(s):
        return _warm(s) if s < W else 1.0 / math.sqrt((s + ts - W) / ts)

    _check(get_inverse_sqrt_schedule(_optimizer(), W, timescale=timescale), formula)


def test_inverse_sqrt_without_warmup_uses_10000():
    _check(get_inverse_sqrt_schedule(_optimizer(), 0), lambda s: 1.0 / math.sqrt((s + 10_000) / 10_000))


@pytest.mark.parametrize("kw, rate", [({"min_lr": 0.01}, 0.1), ({"min_lr_rate": 0.2}, 0.2)])
def test_cosine_with_min_lr(kw, rate):
    def formula(s):
        if s < W:
            return _warm(s)
        f = 0.5 * (1 + math.cos(math.pi * 0.5 * 2 * _prog(s)))
        return max(0.0, f * (1 - rate) + rate)

    lrs = _lrs(get_cosine_with_min_lr_schedule_with_warmup(_optimizer(), W, T, **kw))
    assert lrs == pytest.approx(_expected(formula), rel=1e-9)
    assert min(lrs[W:]) == pytest.approx(LR * rate)


def test_cosine_with_min_lr_needs_exactly_one():
    with pytest.raises(ValueError, match="min_lr"):
        get_cosine_with_min_lr_schedule_with_warmup(_optimizer(), W, T)
    with pytest.raises(ValueError, match="only one"):
        get_cosine_with_min_lr_schedule_with_warmup(_optimizer(), W, T, min_lr=0.01, min_lr_rate=0.1)


def _wsd_formula(warmup, decay, ratio, stable, decay_steps=6):
    def shape(kind, p, rising):
        if kind == "linear":
            return p if rising else 1 - p
        if kind == "cosine":
            return 0.5 * (1 - math.cos(math.pi * p)) if rising else 0.5 * (1 + math.cos(math.pi * p))
        return 1 - math.sqrt(1 - p) if rising else 1 - math.sqrt(p)

    def formula(s):
        if s < W:
            return max(0.0, shape(warmup, s / W, True) * (1 - ratio) + ratio)
        if s < W + stable:
            return 1.0
        if s < W + stable + decay_steps:
            return max(0.0, shape(decay, (s - W - stable) / decay_steps, False) * (1 - ratio) + ratio)
        return ratio

    return formula


@pytest.mark.parametrize(
    "warmup, decay, ratio", [("linear", "cosine", 0.0), ("cosine", "linear", 0.1), ("1-sqrt", "1-sqrt", 0.05)]
)
def test_wsd(warmup, decay, ratio):
    scheduler = get_wsd_schedule(
        _optimizer(), W, 6, num_training_steps=T, warmup_type=warmup, decay_type=decay, min_lr_ratio=ratio
    )
    _check(scheduler, _wsd_formula(warmup, decay, ratio, stable=T - W - 6))


def test_wsd_num_stable_steps_wins_with_warning():
    with pytest.warns(UserWarning, match="num_stable_steps"):
        scheduler = get_wsd_schedule(_optimizer(), W, 6, num_training_steps=T, num_stable_steps=2)
    _check(scheduler, _wsd_formula("linear", "cosine", 0.0, stable=2))


def test_wsd_errors():
    with pytest.raises(ValueError, match="num_training_steps"):
        get_wsd_schedule(_optimizer(), W, 6)
    with pytest.raises(ValueError, match="decay_type"):
        get_wsd_schedule(_optimizer(), W, 6, num_training_steps=T, decay_type="exp")


def test_reduce_on_plateau():
    scheduler = get_reduce_on_plateau_schedule(_optimizer(), patience=0, factor=0.5)
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    scheduler.step(1.0)
    scheduler.step(2.0)  # no improvement, patience 0 -> halve
    assert scheduler.optimizer.param_groups[0]["lr"] == pytest.approx(LR / 2)


def _every_lambda_schedule(optimizer):
    return [
        get_constant_schedule(optimizer),
        get_constant_schedule_with_warmup(optimizer, W),
        get_linear_schedule_with_warmup(optimizer, W, T),
        get_cosine_schedule_with_warmup(optimizer, W, T),
        get_cosine_with_hard_restarts_schedule_with_warmup(optimizer, W, T, num_cycles=2),
        get_polynomial_decay_schedule_with_warmup(optimizer, W, T, power=2.0),
        get_inverse_sqrt_schedule(optimizer, W),
        get_cosine_with_min_lr_schedule_with_warmup(optimizer, W, T, min_lr_rate=0.1),
        get_wsd_schedule(optimizer, W, 6, num_training_steps=T),
    ]


@pytest.mark.parametrize("index", range(9))
def test_state_dict_round_trip_resumes_identically(index, tmp_path):
    reference = _every_lambda_schedule(_optimizer())[index]
    expected = _lrs(reference, STEPS)

    first = _every_lambda_schedule(_optimizer())[index]
    head = _lrs(first, 7)
    path = tmp_path / "scheduler.pt"
    torch.save(first.state_dict(), path)
    assert pickle.loads(pickle.dumps(first.lr_lambdas[0]))(9) == first.lr_lambdas[0](9)  # module-level partials

    optimizer = _optimizer()
    resumed = _every_lambda_schedule(optimizer)[index]
    resumed.load_state_dict(torch.load(path, weights_only=False))
    optimizer.param_groups[0]["lr"] = first.get_last_lr()[0]  # what the optimizer state restores
    assert resumed.last_epoch == 7
    assert head + _lrs(resumed, STEPS - 7) == pytest.approx(expected, abs=1e-15)


def test_get_scheduler_dispatches_every_type():
    kwargs = {
        SchedulerType.COSINE_WITH_MIN_LR: {"min_lr_rate": 0.1},
        SchedulerType.COSINE_WARMUP_WITH_MIN_LR: {"min_lr_rate": 0.1},
        SchedulerType.WARMUP_STABLE_DECAY: {"num_decay_steps": 6},
    }
    for schedule_type in SchedulerType:
        scheduler = get_scheduler(schedule_type.value, _optimizer(), W, T, kwargs.get(schedule_type))
        if schedule_type == SchedulerType.REDUCE_ON_PLATEAU:
            assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
        elif schedule_type == SchedulerType.GREEDY:
            assert isinstance(scheduler, GreedyLR)
        else:
            assert isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR)
    linear = get_scheduler(SchedulerType.LINEAR, _optimizer(), W, T)
    assert _lrs(linear) == _lrs(get_linear_schedule_with_warmup(_optimizer(), W, T))
    cosine = get_scheduler("cosine", _optimizer(), W, T, {"num_cycles": 1.0})
    assert _lrs(cosine) == _lrs(get_cosine_schedule_with_warmup(_optimizer(), W, T, num_cycles=1.0))
    inv = get_scheduler("inverse_sqrt", _optimizer(), W, scheduler_specific_kwargs={"timescale": 8})
    assert _lrs(inv) == _lrs(get_inverse_sqrt_schedule(_optimizer(), W, timescale=8))


def test_get_scheduler_constant_and_plateau_need_no_steps():
    assert _lrs(get_scheduler("constant", _optimizer()), 3) == [LR] * 3
    plateau = get_scheduler("reduce_lr_on_plateau", _optimizer(), scheduler_specific_kwargs={"factor": 0.3})
    assert plateau.factor == 0.3


@pytest.mark.parametrize(
    "name, warmup, total, missing",
    [
        ("linear", None, T, "num_warmup_steps"),
        ("constant_with_warmup", None, None, "num_warmup_steps"),
        ("linear", W, None, "num_training_steps"),
        ("cosine", W, None, "num_training_steps"),
        ("polynomial", W, None, "num_training_steps"),
        ("warmup_stable_decay", W, T, "num_decay_steps"),
    ],
)
def test_get_scheduler_missing_argument(name, warmup, total, missing):
    with pytest.raises(ValueError, match=rf"{name} requires `{missing}"):
        get_scheduler(name, _optimizer(), warmup, total)


def test_get_scheduler_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as info:
        get_scheduler("triangular", _optimizer(), W, T)
    message = str(info.value)
    assert "triangular" in message and "lr_scheduler_type" in message
    for schedule_type in SchedulerType:
        assert schedule_type.value in message


def test_every_scheduler_type_has_a_function():
    assert set(schedules.TYPE_TO_SCHEDULER_FUNCTION) == set(SchedulerType)
