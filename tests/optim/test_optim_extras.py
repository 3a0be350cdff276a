"""The upstream ``optim`` names backed by optional packages train a tiny model, with the weights transformers.Trainer
gets; a missing package or device is a clear error. Each case skips when its package is absent."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.optim.factory import get_optimizer_cls_and_kwargs

pytestmark = pytest.mark.slow  # trains on both libraries per optimizer: over a second a test


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None):
        out = self.head(torch.tanh(self.proj(x))).squeeze(-1)
        return ((out - labels) ** 2).mean(), out


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, generator=g), "labels": torch.randn((), generator=g)}


# optim name -> (import name, extra TrainingArguments)
CASES = {
    "schedule_free_adamw": ("schedulefree", {}),
    "schedule_free_radam": ("schedulefree", {}),
    "schedule_free_sgd": ("schedulefree", {}),
    "grokadamw": ("grokadamw", {}),
    "lion_32bit": ("bitsandbytes", {}),
    "adamw_8bit": ("bitsandbytes", {}),
    "paged_adamw_32bit": ("bitsandbytes", {}),
    "rmsprop_bnb": ("bitsandbytes", {}),
    "ademamix": ("bitsandbytes", {}),
    "galore_adamw": ("galore_torch", {"optim_target_modules": ["proj"], "optim_args": "rank=4,update_proj_gap=2"}),
    "galore_adafactor": ("galore_torch", {"optim_target_modules": "all-linear", "optim_args": "rank=4"}),
    "apollo_adamw": ("apollo_torch", {"optim_target_modules": ["proj"], "optim_args": "rank=4"}),
    "adamw_torch_8bit": ("torchao", {}),
    "stable_adamw": ("optimi", {"weight_decay": 0.01}),
}


def _train(trainer_cls, args_cls, tmp_path, optim: str, extra: dict) -> dict[str, torch.Tensor]:
    args = args_cls(output_dir=str(tmp_path), optim=optim, learning_rate=1e-2, per_device_train_batch_size=16,
                    num_train_epochs=8, report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True,
                    logging_steps=1, **extra)
    model = Tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer_cls(model=model, args=args, train_dataset=Data()).train()
    after = model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained
    return {k: v.detach().clone() for k, v in after.items()}


@pytest.mark.parametrize("optim", sorted(CASES))
def test_optimizer_trains_like_upstream(tmp_path, optim: str) -> None:
    module, extra = CASES[optim]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (see the optimizer extras in pyproject.toml)")
    ours = _train(Trainer, TrainingArguments, tmp_path / "tw", optim, extra)
    transformers = pytest.importorskip("transformers")
    if optim in ("galore_adamw", "galore_adafactor", "apollo_adamw"):
        torch.manual_seed(0)  # the random projections of the low-rank optimizers draw from the global generator
    theirs = _train(transformers.Trainer, transformers.TrainingArguments, tmp_path / "hf", optim, extra)
    for key in ours:
        torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-6, msg=f"{optim}: {key}")


def test_missing_package_or_device_is_a_clear_error(tmp_path) -> None:
    def cls_for(optim: str, **extra):
        return get_optimizer_cls_and_kwargs(TrainingArguments(str(tmp_path), optim=optim, **extra), Tiny())

    with pytest.raises(NotImplementedError, match="needs a TPU and torch_xla"):
        cls_for("adamw_torch_xla")
    with pytest.raises(NotImplementedError, match="fused_backward"):
        cls_for("lomo")
    with pytest.raises(NotImplementedError, match="torchdistx"):
        cls_for("adamw_anyprecision")
    if importlib.util.find_spec("galore_torch") is not None:
        with pytest.raises(NotImplementedError, match="use optim='galore_adamw' instead"):
            cls_for("galore_adamw_layerwise", optim_target_modules=["proj"])
        with pytest.raises(ValueError, match="needs optim_target_modules"):
            cls_for("galore_adamw")
        with pytest.raises(ValueError, match="matches no nn.Linear module"):
            cls_for("galore_adamw", optim_target_modules=["nothing_here"])
    if importlib.util.find_spec("optimi") is None:
        with pytest.raises(ImportError, match="needs the `torch-optimi` package"):
            cls_for("stable_adamw")


def test_optim_target_modules_without_a_low_rank_optimizer_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="only used by the GaLore and APOLLO optimizers"):
        TrainingArguments(str(tmp_path), optim_target_modules=["proj"])


@pytest.mark.parametrize("kwargs", [{"min_lr_rate": 0.1}, {"min_lr": 1e-3, "warmup_lr_rate": 0.2},
                                    {"min_lr_rate": 0.0, "num_cycles": 1.0}])
@pytest.mark.parametrize("warmup", [0, 1, 3])
def test_cosine_warmup_with_min_lr_matches_upstream(kwargs: dict, warmup: int) -> None:
    transformers = pytest.importorskip("transformers")
    from trainwell.optim.schedules import get_scheduler

    def lrs(get) -> list[float]:
        optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-2)
        scheduler = get("cosine_warmup_with_min_lr", optimizer=optimizer, num_warmup_steps=warmup,
                        num_training_steps=10, scheduler_specific_kwargs=dict(kwargs))
        out = []
        for _ in range(12):
            out.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
        return out

    assert lrs(get_scheduler) == pytest.approx(lrs(transformers.get_scheduler), rel=1e-12, abs=1e-15)


def test_cosine_warmup_with_min_lr_needs_a_floor(tmp_path) -> None:
    from trainwell.optim.schedules import get_scheduler

    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-2)
    with pytest.raises(ValueError, match="cosine_warmup_with_min_lr needs one of `min_lr` or `min_lr_rate`"):
        get_scheduler("cosine_warmup_with_min_lr", optimizer=optimizer, num_warmup_steps=1, num_training_steps=5)
    args = TrainingArguments(str(tmp_path), lr_scheduler_type="cosine_warmup_with_min_lr",
                             lr_scheduler_kwargs={"min_lr_rate": 0.1})
    assert args.lr_scheduler_type.value == "cosine_warmup_with_min_lr"


def test_schedule_free_evaluates_the_averaged_weights_like_upstream(tmp_path) -> None:
    pytest.importorskip("schedulefree")
    transformers = pytest.importorskip("transformers")
    logs = []
    for lib, sub in ((None, "tw"), (transformers, "hf")):
        kw = dict(output_dir=str(tmp_path / sub), optim="schedule_free_adamw", learning_rate=1e-2,
                  per_device_train_batch_size=16, per_device_eval_batch_size=16, num_train_epochs=4,
                  eval_strategy="steps", eval_steps=2, report_to="none", use_cpu=True, save_strategy="no",
                  disable_tqdm=True)
        model = Tiny()
        trainer = (Trainer(model=model, args=TrainingArguments(**kw), train_dataset=Data(), eval_dataset=Data())
                   if lib is None else lib.Trainer(model=model, args=lib.TrainingArguments(**kw),
                                                   train_dataset=Data(), eval_dataset=Data()))
        trainer.train()
        logs.append([entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry])
    assert len(logs[0]) == 2
    assert logs[0] == pytest.approx(logs[1], rel=1e-5)
