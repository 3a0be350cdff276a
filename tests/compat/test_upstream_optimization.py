"""The schedules, GreedyLR and Adafactor's helpers against ``transformers.optimization`` on the same inputs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainwell

transformers = pytest.importorskip("transformers")
upstream = pytest.importorskip("transformers.optimization")


def _optimizer(lr: float = 0.1, groups: int = 1) -> torch.optim.Optimizer:
    params = [{"params": [nn.Parameter(torch.ones(2))]} for _ in range(groups)]
    return torch.optim.SGD(params, lr=lr)


def _rates(make, steps: int = 14) -> list[float]:
    optimizer = _optimizer()
    scheduler = make(optimizer)
    rates = []
    for _ in range(steps):
        rates.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return rates


SCHEDULES = [
    ("get_cosine_with_hard_restarts_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=12,
                                                                num_cycles=2)),
    ("get_polynomial_decay_schedule_with_warmup", dict(num_warmup_steps=3, num_training_steps=10, lr_end=1e-3,
                                                       power=2.0)),
    ("get_inverse_sqrt_schedule", dict(num_warmup_steps=3, timescale=4)),
    ("get_inverse_sqrt_schedule", dict(num_warmup_steps=0)),
    ("get_cosine_with_min_lr_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=12, min_lr=1e-3)),
    ("get_cosine_with_min_lr_schedule_with_warmup", dict(num_warmup_steps=2, num_training_steps=12,
                                                         min_lr_rate=0.2, num_cycles=0.3)),
    ("get_cosine_with_min_lr_schedule_with_warmup_lr_rate", dict(num_warmup_steps=3, num_training_steps=12,
                                                                 min_lr_rate=0.1, warmup_lr_rate=0.05)),
    ("get_wsd_schedule", dict(num_warmup_steps=2, num_decay_steps=4, num_training_steps=12, min_lr_ratio=0.1)),
    ("get_wsd_schedule", dict(num_warmup_steps=3, num_decay_steps=5, num_stable_steps=2, warmup_type="cosine",
                              decay_type="1-sqrt")),
    ("get_wsd_schedule", dict(num_warmup_steps=2, num_decay_steps=6, num_training_steps=10, decay_type="linear",
                              warmup_type="1-sqrt")),
]


@pytest.mark.parametrize("name, kwargs", SCHEDULES, ids=lambda v: v if isinstance(v, str) else None)
def test_top_level_schedule_equals_upstream(name, kwargs):
    ours, theirs = getattr(trainwell, name), getattr(transformers, name)
    assert _rates(lambda o: ours(o, **kwargs)) == pytest.approx(_rates(lambda o: theirs(o, **kwargs)), rel=1e-12)


def test_reduce_on_plateau_schedule_equals_upstream():
    def run(lib):
        optimizer = _optimizer()
        scheduler = lib.get_reduce_on_plateau_schedule(optimizer, patience=1, factor=0.5)
        for metric in (1.0, 0.9, 0.95, 0.96, 0.97, 0.5, 0.6, 0.7):
            scheduler.step(metric)
        return type(scheduler), optimizer.param_groups[0]["lr"]

    assert run(trainwell) == run(transformers)


# ----------------------------------------------------------------------------------------------- GreedyLR
METRICS = [5.0, 4.0, 3.5, 3.0, 2.5, 2.6, 2.7, 2.8, 2.9, 2.4, 2.3, 2.2, 2.1, 2.0, 3.0, 3.1, 3.2, 3.3, 3.4, 3.5,
           3.6, 3.7, 3.8, 3.9, 4.0]
GREEDY_KWARGS = [
    dict(patience=2),
    dict(patience=1, factor=0.5, cooldown=1, warmup=2, min_lr=0.02, max_lr=0.3),
    dict(patience=1, factor=0.5, min_lr=0.05, reset_start=2, threshold_mode="rel", threshold=0.01),
    dict(mode="max", patience=1, smooth=True, window_size=3, min_lr=[0.01, 0.02], max_lr=[0.5, 0.4]),
]


def _greedy_trace(lib, kwargs):
    optimizer = _optimizer(groups=2)
    scheduler = lib.GreedyLR(optimizer, **kwargs)
    trace = []
    for metric in METRICS:
        scheduler.step(metric)
        trace.append((scheduler.get_last_lr(), scheduler.num_good_epochs, scheduler.num_bad_epochs,
                      scheduler.best))
    return trace, scheduler


@pytest.mark.parametrize("kwargs", GREEDY_KWARGS)
def test_greedy_lr_follows_the_metric_as_upstream(kwargs):
    ours, ours_scheduler = _greedy_trace(trainwell, kwargs)
    theirs, their_scheduler = _greedy_trace(upstream, kwargs)
    assert ours == theirs
    assert len({tuple(rates) for rates, *_ in ours}) > 2  # the rate moved, both ways or down and reset
    assert ours_scheduler.state_dict() == their_scheduler.state_dict()


def test_greedy_lr_state_interchanges_with_upstream():
    kwargs = GREEDY_KWARGS[3]
    _, theirs = _greedy_trace(upstream, kwargs)
    optimizer = _optimizer(groups=2)
    ours = trainwell.GreedyLR(optimizer, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    assert [g["lr"] for g in optimizer.param_groups] == [g["lr"] for g in theirs.optimizer.param_groups]
    for metric in (1.0, 0.5, 0.4):
        ours.step(metric)
        theirs.step(metric)
    assert ours.state_dict() == theirs.state_dict()


def test_greedy_lr_errors_as_upstream():
    for kwargs in (dict(factor=1.0), dict(mode="middle"), dict(threshold_mode="pct"), dict(min_lr=[0.1, 0.2])):
        with pytest.raises(ValueError):
            upstream.GreedyLR(_optimizer(), **kwargs)
        with pytest.raises(ValueError):
            trainwell.GreedyLR(_optimizer(), **kwargs)


def test_get_scheduler_greedy_passes_the_scheduler_kwargs():
    kwargs = {"patience": 3, "factor": 0.8}
    ours = trainwell.get_scheduler("greedy", _optimizer(), scheduler_specific_kwargs=kwargs)
    theirs = transformers.get_scheduler("greedy", _optimizer(), scheduler_specific_kwargs=kwargs)
    assert isinstance(ours, trainwell.GreedyLR) and ours.state_dict() == theirs.state_dict()


class _Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


def _rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return [{"x": x[i], "labels": x[i].sum() * 2} for i in range(n)]


def _greedy_run(lib, tmp_path):
    args = lib.TrainingArguments(
        output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True, disable_tqdm=True, max_steps=8,
        per_device_train_batch_size=2, learning_rate=0.05, eval_strategy="steps", eval_steps=1, logging_steps=1,
        save_strategy="no", lr_scheduler_type="greedy",
        lr_scheduler_kwargs={"patience": 1, "factor": 0.5, "min_lr": 0.001, "max_lr": 0.2})
    trainer = lib.Trainer(model=_Regressor(), args=args, train_dataset=_rows(16, 1), eval_dataset=_rows(4, 2))
    trainer.train()
    rates = [entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry]
    return args, trainer, rates


@pytest.mark.slow  # over a second
def test_lr_scheduler_type_greedy_trains_as_upstream(tmp_path):
    ours_args, ours, our_rates = _greedy_run(trainwell, tmp_path)
    theirs_args, theirs, their_rates = _greedy_run(transformers, tmp_path)
    assert ours_args.metric_for_best_model == theirs_args.metric_for_best_model == "loss"
    assert type(ours.lr_scheduler).__name__ == "GreedyLR"
    assert our_rates == pytest.approx(their_rates, rel=1e-6)
    assert len(set(our_rates)) > 1  # the evaluations moved the rate
    our_state, their_state = ours.lr_scheduler.state_dict(), theirs.lr_scheduler.state_dict()
    assert our_state.pop("best") == pytest.approx(their_state.pop("best"), rel=1e-6)  # the eval loss: float noise
    assert our_state == their_state


def test_lr_scheduler_type_greedy_needs_an_eval_strategy(tmp_path):
    for lib in (trainwell, transformers):
        with pytest.raises(ValueError, match="greedy"):
            lib.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, lr_scheduler_type="greedy")


# ---------------------------------------------------------------------------------------------- Adafactor
def _adafactor_pair(**kwargs):
    models = []
    for _ in range(2):
        torch.manual_seed(3)
        models.append(nn.Linear(4, 3))
    return (trainwell.Adafactor(models[0].parameters(), **kwargs), models[0]), \
        (upstream.Adafactor(models[1].parameters(), **kwargs), models[1])


def _floats(values) -> list[float]:
    return [float(v) for v in values]  # upstream keeps the parameter's RMS as a tensor


@pytest.mark.parametrize("kwargs", [dict(), dict(warmup_init=True), dict(lr=0.01, relative_step=False),
                                    dict(lr=0.01, relative_step=False, scale_parameter=False)])
def test_adafactor_get_lr_and_schedule_equal_upstream(kwargs):
    pairs = _adafactor_pair(**kwargs)
    schedules = [lib.AdafactorSchedule(opt, initial_lr=0.5) for lib, (opt, _) in zip((trainwell, upstream), pairs)]
    for _ in range(3):
        for (opt, model), schedule in zip(pairs, schedules):
            model(torch.ones(2, 4)).pow(2).sum().backward()
            opt.step()
            schedule.step()
        ours, theirs = (opt for opt, _ in pairs)
        for our_group, their_group in zip(ours.param_groups, theirs.param_groups):
            state = ours.state[our_group["params"][0]]
            assert float(ours._get_lr(our_group, state)) == pytest.approx(
                float(upstream.Adafactor._get_lr(their_group, theirs.state[their_group["params"][0]])), rel=1e-6)
        assert _floats(schedules[0].get_last_lr()) == pytest.approx(_floats(schedules[1].get_last_lr()), rel=1e-6)
    assert trainwell.AdafactorSchedule(_adafactor_pair()[0][0], 0.5).get_last_lr() == [0.5]  # before a step


def test_adafactor_static_helpers_equal_upstream():
    t = torch.arange(6.0).reshape(2, 3)
    assert trainwell.Adafactor._rms(t) == pytest.approx(float(upstream.Adafactor._rms(t)))
    group = {"beta1": 0.9}
    assert trainwell.Adafactor._get_options(group, (2, 3)) == upstream.Adafactor._get_options(group, (2, 3))
    assert trainwell.Adafactor._get_options({"beta1": None}, (3,)) == (False, False)
