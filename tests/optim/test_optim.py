"""Tests for trainwell.optim.factory: decay parameter names, parameter groups, the optimizer factory and Adafactor."""

from __future__ import annotations

import io
import warnings

import pytest
import torch
from torch import nn

from helpers.optim_args import OptimizerArgs
from trainwell.optim.factory import (
    SUPPORTED_OPTIMIZERS,
    Adafactor,
    build_param_groups,
    create_optimizer,
    get_decay_parameter_names,
    get_optimizer_cls_and_kwargs,
    parse_optim_args,
)
from trainwell.trainer_utils import OptimizerNames


Args = OptimizerArgs


class MyRMSNorm(nn.Module):
    """A model-defined norm layer (class name contains "Norm") with a parameter not called "bias"."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Tiny(nn.Module):
    """Embedding -> Linear -> LayerNorm -> custom norm -> Linear head (no bias)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4)
        self.proj = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.block = nn.Sequential(nn.Linear(4, 4), MyRMSNorm(4), nn.BatchNorm1d(4))
        self.head = nn.Linear(4, 2, bias=False)
        self.final_norm = nn.Linear(2, 2, bias=False)  # name pattern "_norm" -> no decay, like upstream

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.final_norm(self.head(self.block(self.ln(self.proj(self.embed(ids))))))


def test_decay_names_exclude_biases_and_norm_weights():
    names = get_decay_parameter_names(Tiny())
    assert names == ["embed.weight", "proj.weight", "block.0.weight", "head.weight"]


def test_whole_model_that_is_a_norm_has_no_decay_parameters():
    assert get_decay_parameter_names(nn.LayerNorm(3)) == []
    assert get_decay_parameter_names(nn.GroupNorm(1, 2)) == []


def test_param_groups_split_and_skip_frozen():
    model = Tiny()
    model.embed.weight.requires_grad_(False)
    groups = build_param_groups(model, 0.1)
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]
    params = dict(model.named_parameters())
    decay_ids = {id(p) for p in groups[0]["params"]}
    no_decay_ids = {id(p) for p in groups[1]["params"]}
    assert decay_ids == {id(params[n]) for n in ("proj.weight", "block.0.weight", "head.weight")}
    expected_no_decay = set(params) - {"embed.weight", "proj.weight", "block.0.weight", "head.weight"}
    assert no_decay_ids == {id(params[n]) for n in expected_no_decay}


def test_groups_are_upstreams_without_weight_decay_too():
    # one group would be numerically the same, but optimizer.pt must have upstream's groups to interchange
    groups = build_param_groups(nn.Linear(3, 2), 0.0)
    assert [(g["weight_decay"], len(g["params"])) for g in groups] == [(0.0, 1), (0.0, 1)]


def test_empty_group_kept_as_upstream():
    groups = build_param_groups(nn.LayerNorm(3), 0.1)
    assert [(g["weight_decay"], len(g["params"])) for g in groups] == [(0.1, 0), (0.0, 2)]
    frozen_biases = nn.Linear(3, 2)
    frozen_biases.bias.requires_grad_(False)
    assert [len(g["params"]) for g in build_param_groups(frozen_biases, 0.1)] == [1, 0]


def test_create_optimizer_uses_groups_and_weight_decay():
    optimizer = create_optimizer(Tiny(), Args(weight_decay=0.01, learning_rate=1e-3))
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    assert all(g["lr"] == 1e-3 for g in optimizer.param_groups)


def test_create_optimizer_without_trainable_parameters():
    model = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ValueError, match="requires_grad"):
        create_optimizer(model, Args())


ADAM = {"lr": 5e-5, "betas": (0.9, 0.999), "eps": 1e-8}


@pytest.mark.parametrize(
    "name, cls, expected",
    [
        ("adamw_torch", torch.optim.AdamW, ADAM),
        (OptimizerNames.ADAMW_TORCH, torch.optim.AdamW, ADAM),
        ("adafactor", Adafactor, {"lr": 5e-5, "scale_parameter": False, "relative_step": False}),
        ("sgd", torch.optim.SGD, {"lr": 5e-5, "momentum": 0.0}),
        ("adagrad", torch.optim.Adagrad, {"lr": 5e-5}),
        ("rmsprop", torch.optim.RMSprop, {"lr": 5e-5}),
    ],
)
def test_optimizer_cls_and_kwargs(name, cls, expected):
    optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(Args(optim=name))
    assert optimizer_cls is cls and kwargs == expected
    optimizer = create_optimizer(nn.Linear(3, 2), Args(optim=name, weight_decay=0.1))
    assert type(optimizer) is cls
    for key, value in expected.items():
        assert optimizer.defaults[key] == value


def test_adam_hyper_parameters_come_from_args():
    args = Args(learning_rate=2e-3, adam_beta1=0.8, adam_beta2=0.95, adam_epsilon=1e-6)
    optimizer = create_optimizer(nn.Linear(3, 2), args)
    assert optimizer.defaults["betas"] == (0.8, 0.95)
    assert optimizer.defaults["eps"] == 1e-6 and optimizer.defaults["lr"] == 2e-3


def test_adamw_hf_is_torch_adamw_with_future_warning():
    with pytest.warns(FutureWarning, match="adamw_hf"):
        optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_hf"))
    assert optimizer_cls is torch.optim.AdamW and kwargs == ADAM


def test_adamw_torch_fused_on_cpu():
    model = nn.Linear(3, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch >= 2.4 has fused AdamW kernels for CPU float32: no fallback
        optimizer = create_optimizer(model, Args(optim="adamw_torch_fused"))
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True
    model(torch.ones(1, 3)).sum().backward()
    before = model.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(before, model.weight)


def test_the_default_optim_is_upstreams_fused_adamw(tmp_path):
    """Upstream 5.x defaults to adamw_torch_fused with torch >= 2.8; trainwell builds the same fused AdamW (CPU too)."""
    from trainwell import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path))
    assert args.optim == OptimizerNames.ADAMW_TORCH_FUSED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer = create_optimizer(nn.Linear(3, 2), args)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["fused"] is True
    transformers = pytest.importorskip("transformers")
    assert args.optim.value == transformers.TrainingArguments(output_dir=str(tmp_path)).optim.value


@pytest.mark.parametrize("version, expected", [("2.13.0+cpu", "adamw_torch_fused"), ("2.8.0", "adamw_torch_fused"),
                                               ("2.7.1+cu126", "adamw_torch"), ("3.0.0a0", "adamw_torch_fused")])
def test_default_optim_follows_the_torch_version(monkeypatch, version, expected):
    import types

    from trainwell.args.fields import _default_optim

    monkeypatch.setitem(__import__("sys").modules, "torch", types.SimpleNamespace(__version__=version))
    assert _default_optim() == expected


def test_adamw_torch_fused_falls_back_for_unsupported_params():
    model = nn.Linear(3, 2, device="meta")  # no fused kernels for the meta device
    with pytest.warns(UserWarning, match="falling back"):
        optimizer_cls, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_torch_fused"), model)
    assert optimizer_cls is torch.optim.AdamW and "fused" not in kwargs


def test_parse_optim_args():
    parsed = parse_optim_args("momentum=0.9, nesterov=true,betas=(0.8,0.9),foreach=none,name=abc,step=3")
    assert parsed == {
        "momentum": 0.9,
        "nesterov": True,
        "betas": (0.8, 0.9),
        "foreach": None,
        "name": "abc",
        "step": 3,
    }
    assert parse_optim_args(None) == {} and parse_optim_args("") == {}
    with pytest.raises(ValueError, match="key=value"):
        parse_optim_args("momentum")


def test_optim_args_merge_and_override():
    optimizer = create_optimizer(nn.Linear(3, 2), Args(optim="sgd", optim_args="momentum=0.9,nesterov=True"))
    assert isinstance(optimizer, torch.optim.SGD)
    assert optimizer.defaults["momentum"] == 0.9 and optimizer.defaults["nesterov"] is True
    _, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adamw_torch", optim_args="eps=1e-5,amsgrad=true"))
    assert kwargs["eps"] == 1e-5 and kwargs["amsgrad"] is True and kwargs["betas"] == (0.9, 0.999)
    _, kwargs = get_optimizer_cls_and_kwargs(Args(optim="adafactor", optim_args="beta1=0.9,clip_threshold=2"))
    assert kwargs["beta1"] == 0.9 and kwargs["clip_threshold"] == 2 and kwargs["relative_step"] is False


def test_optim_args_unknown_key():
    with pytest.raises(ValueError, match=r"\['momentun'\].*SGD"):
        get_optimizer_cls_and_kwargs(Args(optim="sgd", optim_args="momentun=0.9"))


def test_unknown_optimizer_lists_supported_names():
    with pytest.raises(ValueError) as info:
        get_optimizer_cls_and_kwargs(Args(optim="lion"))
    assert "'lion'" in str(info.value)
    for name in SUPPORTED_OPTIMIZERS:
        assert name in str(info.value)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(_has("apex") or _has("bitsandbytes"), reason="apex/bitsandbytes installed")
@pytest.mark.parametrize("name, package", [("adamw_apex_fused", "apex"), ("adamw_bnb_8bit", "bitsandbytes")])
def test_apex_and_bnb_need_their_package(name, package):
    with pytest.raises(ImportError, match=package):
        get_optimizer_cls_and_kwargs(Args(optim=name))


def test_deprecated_adafactor_flag_selects_adafactor():
    args = Args()
    args.adafactor = True
    assert get_optimizer_cls_and_kwargs(args)[0] is Adafactor


# --- Adafactor ---------------------------------------------------------------------------------------------------


def _quadratic_problem(start: float = 0.0):
    torch.manual_seed(0)
    target = torch.randn(6, 4)
    weight = nn.Parameter(torch.full((6, 4), start))
    bias = nn.Parameter(torch.full((4,), start))
    return target, weight, bias


def _loss(target, weight, bias):
    return ((weight - target) ** 2).mean() + ((bias - 1.0) ** 2).mean()


def _run(optimizer, target, weight, bias, steps):
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = _loss(target, weight, bias)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize(
    "kwargs",
    [
        {"lr": 0.05, "scale_parameter": False, "relative_step": False},
        {"lr": 0.05, "scale_parameter": False, "relative_step": False, "beta1": 0.9, "weight_decay": 0.01},
        {},  # relative step with parameter scaling (the paper's default): needs non-zero parameters to move
    ],
)
def test_adafactor_reduces_quadratic_loss(kwargs):
    target, weight, bias = _quadratic_problem(start=0.0 if kwargs else 3.0)
    optimizer = Adafactor([weight, bias], **kwargs)
    losses = _run(optimizer, target, weight, bias, 60)
    assert losses[-1] < 0.5 * losses[0]
    state = optimizer.state[weight]
    assert state["exp_avg_sq_row"].shape == (6,) and state["exp_avg_sq_col"].shape == (4,)  # factored
    assert "exp_avg_sq" not in state and optimizer.state[bias]["exp_avg_sq"].shape == (4,)
    assert state["step"] == 60


def test_adafactor_first_step_matches_paper_formula():
    # With one step and no first moment, v = g^2 + eps1 exactly (beta2t = 0 at step 1), so for a vector the
    # update is lr * g / sqrt(g^2 + eps1), clipped to RMS clip_threshold.
    param = nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = Adafactor([param], lr=0.1, scale_parameter=False, relative_step=False)
    param.grad = torch.tensor([0.5, -0.25, 2.0])
    optimizer.step()
    assert torch.allclose(param.detach(), torch.tensor([0.9, -1.9, 2.9]))


def test_adafactor_state_dict_round_trip():
    target, weight, bias = _quadratic_problem()
    kwargs = {"lr": 0.05, "scale_parameter": False, "relative_step": False, "beta1": 0.9}
    optimizer = Adafactor([weight, bias], **kwargs)
    _run(optimizer, target, weight, bias, 5)
    buffer = io.BytesIO()
    torch.save({"opt": optimizer.state_dict(), "w": weight.detach().clone(), "b": bias.detach().clone()}, buffer)

    expected = _run(optimizer, target, weight, bias, 5)
    expected_weight = weight.detach().clone()

    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    weight2, bias2 = nn.Parameter(saved["w"]), nn.Parameter(saved["b"])
    resumed = Adafactor([weight2, bias2], **kwargs)
    resumed.load_state_dict(saved["opt"])
    assert resumed.state[weight2]["step"] == 5
    assert _run(resumed, target, weight2, bias2, 5) == expected
    assert torch.equal(weight2.detach(), expected_weight)


def test_adafactor_argument_checks():
    param = nn.Parameter(torch.zeros(2))
    with pytest.raises(ValueError, match="relative_step"):
        Adafactor([param], lr=0.1)
    with pytest.raises(ValueError, match="warmup_init"):
        Adafactor([param], lr=0.1, relative_step=False, warmup_init=True)


def test_adafactor_bf16_parameter_updates_in_place():
    param = nn.Parameter(torch.ones(3, 2, dtype=torch.bfloat16))
    optimizer = Adafactor([param], lr=0.1, scale_parameter=False, relative_step=False)
    param.grad = torch.ones(3, 2, dtype=torch.bfloat16)
    optimizer.step()
    assert param.dtype == torch.bfloat16
    assert torch.allclose(param.float(), torch.full((3, 2), 0.9), atol=1e-2)


def test_adafactor_factored_update_matches_row_column_formula():
    # v_t = R_t C_t^T / mean(R_t), with R/C running means of the row/column means of g^2 + eps1 and
    # beta2_t = 1 - t^-0.8; the update is lr * g / sqrt(v_t) (clipping disabled here).
    torch.manual_seed(1)
    param = nn.Parameter(torch.randn(3, 4))
    expected = param.detach().clone()
    optimizer = Adafactor([param], lr=0.1, scale_parameter=False, relative_step=False, clip_threshold=1e9)
    rows, cols = torch.zeros(3), torch.zeros(4)
    for t in (1, 2, 3):
        grad = torch.randn(3, 4)
        param.grad = grad.clone()
        optimizer.step()
        beta2t = 1 - t**-0.8
        squared = grad**2 + 1e-30
        rows = beta2t * rows + (1 - beta2t) * squared.mean(1)
        cols = beta2t * cols + (1 - beta2t) * squared.mean(0)
        expected -= 0.1 * grad / (torch.outer(rows, cols) / rows.mean()).sqrt()
    assert torch.allclose(param.detach(), expected, atol=1e-6)


def test_a_checkpoint_of_the_unfused_adamw_resumes_under_the_fused_default(tmp_path):
    """A checkpoint written with optim='adamw_torch' (trainwell's former default) resumes under today's default
    (adamw_torch_fused): the optimizer state is the same AdamW state, and its saved param groups come back with it
    (fused=None: torch's unfused default), so the resumed run ends on the uninterrupted unfused run's weights bit
    for bit (as upstream)."""
    from helpers.callbacks import StopAtStep
    from helpers.data import regression_data
    from helpers.models import RegressionModel
    from trainwell import Trainer, TrainingArguments

    data = regression_data(48)

    def run(out: str, resume: bool = False, stop: int | None = None, **extra) -> Trainer:
        args = TrainingArguments(output_dir=str(tmp_path / out), max_steps=6, per_device_train_batch_size=8,
                                 learning_rate=0.05, save_strategy="steps", save_steps=3, report_to="none",
                                 disable_tqdm=True, seed=1, **extra)
        trainer = Trainer(model_init=lambda: RegressionModel(), args=args, train_dataset=data,
                          callbacks=[StopAtStep(stop)] if stop else [])
        trainer.train(resume_from_checkpoint=True if resume else None)
        return trainer

    whole = run("whole", optim="adamw_torch")
    run("split", stop=3, optim="adamw_torch")
    resumed = run("split", resume=True)
    assert resumed.args.optim == OptimizerNames.ADAMW_TORCH_FUSED and resumed.state.global_step == 6
    assert len(resumed.optimizer.param_groups) == 2 and not any(g["fused"] for g in resumed.optimizer.param_groups)
    for a, b in zip(whole.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(a, b)
