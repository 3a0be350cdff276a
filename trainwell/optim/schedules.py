"""Learning-rate schedules with the upstream names and formulas.

Every ``get_*_schedule*`` function returns a :class:`torch.optim.lr_scheduler.LambdaLR` whose multiplier is a
``functools.partial`` of a module-level function, so ``scheduler.state_dict()`` (which pickles the lambdas' state)
works and a resumed scheduler continues exactly where it stopped. ``get_reduce_on_plateau_schedule`` returns a
:class:`torch.optim.lr_scheduler.ReduceLROnPlateau` and ``get_greedy_schedule`` a :class:`~trainwell.optim.greedy.GreedyLR`
(both step on evaluation metrics). :func:`get_scheduler` picks one by its
:class:`~trainwell.trainer_utils.SchedulerType` name (the ``lr_scheduler_type`` training argument).

The multiplier at optimizer step ``s`` (counted from 0) for ``W`` warm-up and ``T`` training steps:

- warm-up (all ``*_with_warmup`` schedules): ``s / max(1, W)`` while ``s < W``;
- linear: ``max(0, (T - s) / max(1, T - W))``;
- cosine: ``max(0, 0.5 * (1 + cos(pi * num_cycles * 2 * p)))`` with ``p = (s - W) / max(1, T - W)``;
- cosine with hard restarts: ``0`` once ``p >= 1``, else ``max(0, 0.5 * (1 + cos(pi * ((num_cycles * p) % 1))))``;
- polynomial: ``((lr0 - lr_end) * (1 - (s - W) / (T - W)) ** power + lr_end) / lr0``, ``lr_end / lr0`` after ``T``;
- inverse square root: ``1 / sqrt((s + timescale - W) / timescale)`` after warm-up;
- cosine with min lr: the cosine factor ``f`` rescaled to ``f * (1 - r) + r`` with ``r = min_lr / lr0``;
- warmup-stable-decay: warm-up, a flat stretch, then a linear/cosine/1-sqrt decay down to ``min_lr_ratio``.
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import TYPE_CHECKING, Any, Callable

from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau

from ..utils.option_enums import SchedulerType
from .greedy import GreedyLR, get_greedy_schedule

if TYPE_CHECKING:  # for annotations only (``import trainwell`` does not load this module)
    from torch.optim import Optimizer

__all__ = [
    "get_constant_schedule",
    "get_constant_schedule_with_warmup",
    "get_linear_schedule_with_warmup",
    "get_cosine_schedule_with_warmup",
    "get_cosine_with_hard_restarts_schedule_with_warmup",
    "get_polynomial_decay_schedule_with_warmup",
    "get_inverse_sqrt_schedule",
    "get_reduce_on_plateau_schedule",
    "get_cosine_with_min_lr_schedule_with_warmup",
    "get_cosine_with_min_lr_schedule_with_warmup_lr_rate",
    "get_wsd_schedule",
    "get_greedy_schedule",
    "get_scheduler",
    "TYPE_TO_SCHEDULER_FUNCTION",
]

_WSD_SHAPES = ("linear", "cosine", "1-sqrt")


def _lambda_lr(optimizer: Optimizer, lr_lambda: Callable[[int], float], last_epoch: int) -> LambdaLR:
    return LambdaLR(optimizer, lr_lambda, last_epoch=last_epoch)


def _warmup_factor(current_step: int, num_warmup_steps: int) -> float:
    return float(current_step) / float(max(1, num_warmup_steps))


def _initial_lr(optimizer: Optimizer) -> float:
    lr = optimizer.defaults.get("lr")
    if lr is None:
        raise ValueError(
            "this schedule needs the optimizer's initial learning rate but `optimizer.defaults['lr']` is None; "
            "build the optimizer with an explicit `lr=`."
        )
    return float(lr)


# --- multipliers (module-level so that the partials pickle) -----------------------------------------------------


def _constant_lambda(_: int) -> float:
    return 1.0


def _constant_warmup_lambda(current_step: int, *, num_warmup_steps: int) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    return 1.0


def _linear_warmup_lambda(num_warmup_steps: int, num_training_steps: int, warmup_steps: float, decay_steps: float,
                          current_step: int) -> float:
    # Bound positionally by the schedule's builder with warmup_steps = float(max(1, num_warmup_steps)) and
    # decay_steps = float(max(1, num_training_steps - num_warmup_steps)): this runs per parameter group at every
    # optimizer step. An int over a float divides as upstream's float(step) / float(...).
    if current_step < num_warmup_steps:
        return current_step / warmup_steps
    return max(0.0, (num_training_steps - current_step) / decay_steps)


def _progress(current_step: int, num_warmup_steps: int, num_training_steps: int) -> float:
    return float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))


def _cosine_warmup_lambda(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: float
) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    progress = _progress(current_step, num_warmup_steps, num_training_steps)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


def _hard_restarts_lambda(
    current_step: int, *, num_warmup_steps: int, num_training_steps: int, num_cycles: int
) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    progress = _progress(current_step, num_warmup_steps, num_training_steps)
    if progress >= 1.0:
        return 0.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * ((float(num_cycles) * progress) % 1.0))))


def _polynomial_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float,
    power: float,
    lr_init: float,
) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    if current_step > num_training_steps:
        return lr_end / lr_init
    decay_steps = num_training_steps - num_warmup_steps
    pct_remaining = 1 - (current_step - num_warmup_steps) / decay_steps
    return ((lr_init - lr_end) * pct_remaining**power + lr_end) / lr_init


def _inverse_sqrt_lambda(current_step: int, *, num_warmup_steps: int, timescale: int) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    shift = timescale - num_warmup_steps
    return 1.0 / math.sqrt((current_step + shift) / timescale)


def _cosine_min_lr_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float,
    min_lr_rate: float,
) -> float:
    if current_step < num_warmup_steps:
        return _warmup_factor(current_step, num_warmup_steps)
    progress = _progress(current_step, num_warmup_steps, num_training_steps)
    factor = 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    return max(0.0, factor * (1.0 - min_lr_rate) + min_lr_rate)


def _wsd_shape(kind: str, progress: float, num_cycles: float, *, rising: bool) -> float:
    if kind == "linear":
        return progress if rising else 1.0 - progress
    if kind == "cosine":
        if rising:
            return 0.5 * (1.0 - math.cos(math.pi * progress))
        return 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress))
    # "1-sqrt"
    return 1.0 - math.sqrt(1.0 - progress) if rising else 1.0 - math.sqrt(progress)


def _wsd_lambda(
    current_step: int,
    *,
    num_warmup_steps: int,
    num_stable_steps: int,
    num_decay_steps: int,
    warmup_type: str,
    decay_type: str,
    min_lr_ratio: float,
    num_cycles: float,
) -> float:
    if current_step < num_warmup_steps:
        progress = _warmup_factor(current_step, num_warmup_steps)
        factor = _wsd_shape(warmup_type, progress, num_cycles, rising=True)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    if current_step < num_warmup_steps + num_stable_steps:
        return 1.0
    if current_step < num_warmup_steps + num_stable_steps + num_decay_steps:
        progress = float(current_step - num_warmup_steps - num_stable_steps) / float(max(1, num_decay_steps))
        factor = _wsd_shape(decay_type, progress, num_cycles, rising=False)
        return max(0.0, factor * (1.0 - min_lr_ratio) + min_lr_ratio)
    return float(min_lr_ratio)


# --- public schedules ---------------------------------------------------------------------------------------------


def get_constant_schedule(optimizer: Optimizer, last_epoch: int = -1) -> LambdaLR:
    """A constant learning rate: the optimizer's own ``lr`` at every step."""
    return _lambda_lr(optimizer, _constant_lambda, last_epoch)


def get_constant_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warm-up from 0 to the optimizer's ``lr`` over ``num_warmup_steps``, then constant."""
    lr_lambda = partial(_constant_warmup_lambda, num_warmup_steps=num_warmup_steps)
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_linear_schedule_with_warmup(
    optimizer: Optimizer, num_warmup_steps: int, num_training_steps: int, last_epoch: int = -1
) -> LambdaLR:
    """Linear warm-up to ``lr``, then a linear decay to 0 at ``num_training_steps`` (the Trainer's default)."""
    lr_lambda = partial(_linear_warmup_lambda, num_warmup_steps, num_training_steps, float(max(1, num_warmup_steps)),
                        float(max(1, num_training_steps - num_warmup_steps)))
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warm-up, then a cosine decay; ``num_cycles=0.5`` goes from ``lr`` down to 0 in one half-wave."""
    lr_lambda = partial(
        _cosine_warmup_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_cosine_with_hard_restarts_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: int = 1,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warm-up, then ``num_cycles`` cosine decays each restarting from ``lr``; 0 after training ends."""
    lr_lambda = partial(
        _hard_restarts_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
    )
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_polynomial_decay_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    lr_end: float = 1e-7,
    power: float = 1.0,
    last_epoch: int = -1,
) -> LambdaLR:
    """Linear warm-up, then a polynomial decay of degree ``power`` from the optimizer's ``lr`` to ``lr_end``.

    Raises ``ValueError`` when ``lr_end`` is not below the optimizer's initial ``lr``.
    """
    lr_init = _initial_lr(optimizer)
    if not lr_init > lr_end:
        raise ValueError(
            f"lr_end ({lr_end}) must be smaller than the initial lr ({lr_init}); lower `lr_end` in "
            "`lr_scheduler_kwargs` or raise `learning_rate`."
        )
    lr_lambda = partial(
        _polynomial_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        lr_end=lr_end,
        power=power,
        lr_init=lr_init,
    )
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_inverse_sqrt_schedule(
    optimizer: Optimizer, num_warmup_steps: int, timescale: int | None = None, last_epoch: int = -1
) -> LambdaLR:
    """Linear warm-up, then a decay proportional to ``1 / sqrt(step)`` (``timescale`` defaults to the warm-up
    length, or 10,000 without warm-up)."""
    if timescale is None:
        timescale = num_warmup_steps or 10_000
    lr_lambda = partial(_inverse_sqrt_lambda, num_warmup_steps=num_warmup_steps, timescale=timescale)
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_reduce_on_plateau_schedule(optimizer: Optimizer, **kwargs: Any) -> ReduceLROnPlateau:
    """A :class:`torch.optim.lr_scheduler.ReduceLROnPlateau` (``kwargs`` are passed to it); it steps on a metric,
    so the Trainer calls ``scheduler.step(metric)`` after each evaluation."""
    return ReduceLROnPlateau(optimizer, **kwargs)


def _resolve_min_lr_rate(optimizer: Optimizer, min_lr: float | None, min_lr_rate: float | None, name: str) -> float:
    """The floor as a fraction of the initial lr, from exactly one of ``min_lr`` (absolute) / ``min_lr_rate``."""
    if min_lr is not None and min_lr_rate is not None:
        raise ValueError(
            "only one of `min_lr` or `min_lr_rate` should be set in `lr_scheduler_kwargs`; remove the other."
        )
    if min_lr is not None:
        return min_lr / _initial_lr(optimizer)
    if min_lr_rate is None:
        raise ValueError(
            f"{name} needs one of `min_lr` or `min_lr_rate`; set it through `lr_scheduler_kwargs`, "
            'e.g. {"min_lr": 1e-6}.'
        )
    return min_lr_rate


def get_cosine_with_min_lr_schedule_with_warmup(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
) -> LambdaLR:
    """Cosine decay after warm-up that bottoms out at ``min_lr`` (absolute) or ``min_lr_rate * lr`` (relative).

    Exactly one of ``min_lr`` / ``min_lr_rate`` must be given, else ``ValueError``.
    """
    min_lr_rate = _resolve_min_lr_rate(optimizer, min_lr, min_lr_rate, "cosine_with_min_lr")
    lr_lambda = partial(
        _cosine_min_lr_lambda,
        num_warmup_steps=num_warmup_steps,
        num_training_steps=num_training_steps,
        num_cycles=num_cycles,
        min_lr_rate=min_lr_rate,
    )
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def _cosine_warmup_min_lr_lambda(current_step: int, *, num_warmup_steps: int, num_training_steps: int,
                                 num_cycles: float, min_lr_rate: float, warmup_lr_rate: float | None) -> float:
    step, warmup, total = float(current_step), float(num_warmup_steps), float(num_training_steps)
    if step < warmup:
        if warmup_lr_rate is None:  # the warm-up starts at 1/warmup of lr and reaches lr at its last step
            return (step + 1.0) / max(1.0, warmup)
        rate = float(warmup_lr_rate)
        return rate + (1.0 - rate) * step / max(1.0, warmup - 1.0)
    progress = (step - warmup + 1.0) / max(1.0, total - warmup)
    factor = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
    return max(0.0, factor * (1 - min_lr_rate) + min_lr_rate)


def get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    min_lr: float | None = None,
    min_lr_rate: float | None = None,
    warmup_lr_rate: float | None = None,
) -> LambdaLR:
    """``cosine_warmup_with_min_lr``: like ``cosine_with_min_lr``, but the warm-up never starts at 0 (it starts at
    ``warmup_lr_rate * lr``, by default ``lr / num_warmup_steps``) and the cosine is one step ahead, as upstream.
    """
    min_lr_rate = _resolve_min_lr_rate(optimizer, min_lr, min_lr_rate, "cosine_warmup_with_min_lr")
    lr_lambda = partial(_cosine_warmup_min_lr_lambda, num_warmup_steps=num_warmup_steps,
                        num_training_steps=num_training_steps, num_cycles=num_cycles, min_lr_rate=min_lr_rate,
                        warmup_lr_rate=warmup_lr_rate)
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


def get_wsd_schedule(
    optimizer: Optimizer,
    num_warmup_steps: int,
    num_decay_steps: int,
    num_training_steps: int | None = None,
    num_stable_steps: int | None = None,
    warmup_type: str = "linear",
    decay_type: str = "cosine",
    min_lr_ratio: float = 0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
) -> LambdaLR:
    """Warmup-stable-decay: warm up (``warmup_type``), hold ``lr`` for ``num_stable_steps``, then decay
    (``decay_type``) to ``min_lr_ratio * lr`` over ``num_decay_steps``; types are "linear", "cosine" or "1-sqrt".

    Without ``num_stable_steps`` the stable stretch is ``num_training_steps - num_warmup_steps - num_decay_steps``.
    """
    if num_training_steps is None and num_stable_steps is None:
        raise ValueError(
            "warmup_stable_decay needs `num_training_steps` or `num_stable_steps`; pass one of them."
        )
    if num_training_steps is not None and num_stable_steps is not None:
        warnings.warn(
            "both `num_training_steps` and `num_stable_steps` were given to get_wsd_schedule; "
            "`num_stable_steps` is used.",
            stacklevel=2,
        )
    for arg_name, value in (("warmup_type", warmup_type), ("decay_type", decay_type)):
        if value not in _WSD_SHAPES:
            raise ValueError(f"unknown {arg_name}={value!r}; use one of {list(_WSD_SHAPES)}.")
    if num_stable_steps is None:
        num_stable_steps = num_training_steps - num_warmup_steps - num_decay_steps  # type: ignore[operator]
    lr_lambda = partial(
        _wsd_lambda,
        num_warmup_steps=num_warmup_steps,
        num_stable_steps=num_stable_steps,
        num_decay_steps=num_decay_steps,
        warmup_type=warmup_type,
        decay_type=decay_type,
        min_lr_ratio=min_lr_ratio,
        num_cycles=num_cycles,
    )
    return _lambda_lr(optimizer, lr_lambda, last_epoch)


TYPE_TO_SCHEDULER_FUNCTION: dict[SchedulerType, Callable[..., Any]] = {
    SchedulerType.LINEAR: get_linear_schedule_with_warmup,
    SchedulerType.COSINE: get_cosine_schedule_with_warmup,
    SchedulerType.COSINE_WITH_RESTARTS: get_cosine_with_hard_restarts_schedule_with_warmup,
    SchedulerType.POLYNOMIAL: get_polynomial_decay_schedule_with_warmup,
    SchedulerType.CONSTANT: get_constant_schedule,
    SchedulerType.CONSTANT_WITH_WARMUP: get_constant_schedule_with_warmup,
    SchedulerType.INVERSE_SQRT: get_inverse_sqrt_schedule,
    SchedulerType.REDUCE_ON_PLATEAU: get_reduce_on_plateau_schedule,
    SchedulerType.COSINE_WITH_MIN_LR: get_cosine_with_min_lr_schedule_with_warmup,
    SchedulerType.COSINE_WARMUP_WITH_MIN_LR: get_cosine_with_min_lr_schedule_with_warmup_lr_rate,
    SchedulerType.WARMUP_STABLE_DECAY: get_wsd_schedule,
    SchedulerType.GREEDY: get_greedy_schedule,
}


def _scheduler_type(name: str | SchedulerType) -> SchedulerType:
    try:
        return SchedulerType(name)
    except ValueError:
        valid = [member.value for member in SchedulerType]
        raise ValueError(
            f"unknown lr_scheduler_type {str(name)!r}; use one of {valid}."
        ) from None


def _require(name: SchedulerType, arg_name: str, value: Any) -> None:
    if value is None:
        raise ValueError(f"{name.value} requires `{arg_name}`, please provide that argument.")


def get_scheduler(
    name: str | SchedulerType,
    optimizer: Optimizer,
    num_warmup_steps: int | None = None,
    num_training_steps: int | None = None,
    scheduler_specific_kwargs: dict[str, Any] | None = None,
) -> LambdaLR | ReduceLROnPlateau | GreedyLR:
    """Build the schedule called ``name`` (a :class:`SchedulerType` value, e.g. ``"linear"``) for ``optimizer``.

    ``scheduler_specific_kwargs`` (the ``lr_scheduler_kwargs`` training argument) go to the schedule function.
    Raises ``ValueError`` for an unknown name, or when the schedule needs ``num_warmup_steps`` /
    ``num_training_steps`` (or ``num_decay_steps`` for warmup_stable_decay) and it is missing.
    """
    schedule_type = _scheduler_type(name)
    schedule_func = TYPE_TO_SCHEDULER_FUNCTION[schedule_type]
    kwargs = dict(scheduler_specific_kwargs or {})
    if schedule_type in (SchedulerType.REDUCE_ON_PLATEAU, SchedulerType.GREEDY):  # step on metrics
        return schedule_func(optimizer, **kwargs)
    if schedule_type == SchedulerType.CONSTANT:
        return schedule_func(optimizer)
    _require(schedule_type, "num_warmup_steps", num_warmup_steps)
    if schedule_type == SchedulerType.CONSTANT_WITH_WARMUP:
        return schedule_func(optimizer, num_warmup_steps=num_warmup_steps)
    if schedule_type == SchedulerType.INVERSE_SQRT:
        return schedule_func(optimizer, num_warmup_steps=num_warmup_steps, **kwargs)
    if schedule_type == SchedulerType.WARMUP_STABLE_DECAY:
        _require(schedule_type, "num_decay_steps (in scheduler_specific_kwargs)", kwargs.get("num_decay_steps"))
        return schedule_func(
            optimizer, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, **kwargs
        )
    _require(schedule_type, "num_training_steps", num_training_steps)
    return schedule_func(
        optimizer, num_warmup_steps=num_warmup_steps, num_training_steps=num_training_steps, **kwargs
    )


def trainer_scheduler(args: Any, optimizer: Optimizer | None,
                      num_training_steps: int) -> LambdaLR | ReduceLROnPlateau | GreedyLR:
    """``Trainer.create_scheduler``'s schedule: the TrainingArguments ``args``' ``lr_scheduler_type`` with their
    ``lr_scheduler_kwargs`` and warm-up, over ``num_training_steps`` optimizer steps of ``optimizer``."""
    if optimizer is None:  # (torch's schedulers fail on None: LambdaLR with an AttributeError)
        raise TypeError("create_scheduler needs an optimizer: none was passed and trainer.optimizer is None "
                        "(call create_optimizer() first)")
    return get_scheduler(args.lr_scheduler_type, optimizer=optimizer,
                         num_warmup_steps=args.get_warmup_steps(num_training_steps),
                         num_training_steps=num_training_steps,
                         scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}))  # parsed by the arguments
