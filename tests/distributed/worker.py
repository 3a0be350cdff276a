"""Training scenarios run by the distributed tests, under torchrun (2 ranks) or as one plain process (reference).

Usage: ``python worker.py OUT_DIR SCENARIO...`` (under ``torch.distributed.run`` for several ranks). Rank 0 writes
``OUT_DIR/<scenario>.json`` with the logged losses, the final (consolidated) weights and, where the scenario
evaluates, the predictions. The global batch is the same whatever the number of ranks (8 samples per optimizer
step), so a 2-rank run must reproduce the 1-process run. Scenarios print ``=== <name> ===`` before they start so
the test can split the captured output.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

torch.set_num_threads(1)
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s:%(name)s:%(message)s")

from trainwell import Trainer, TrainingArguments  # noqa: E402

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))
GLOBAL_BATCH = 8


class Block(nn.Module):
    """A residual layer: the unit FSDP's auto_wrap shards (listed in ``_no_split_modules``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.linear(h))


class TinyNet(nn.Module):
    """Regression model returning ``{"loss", "logits"}``."""

    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = torch.tanh(self.inp(x))
        for block in self.blocks:
            h = block(h)
        logits = self.head(h).sum(-1)  # not a view (FSDP2 warns about returned views)
        out = {"logits": logits}
        if labels is not None:
            out = {"loss": nn.functional.mse_loss(logits.float(), labels), **out}
        return out


def make_dataset(n: int, seed: int = 1) -> list[dict[str, torch.Tensor]]:
    """``n`` samples of a fixed random regression problem."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x @ torch.tensor([0.5, -1.0, 2.0, 0.3])).sin() + 0.1 * torch.randn(n, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def make_args(out: Path, **overrides: Any) -> TrainingArguments:
    """Arguments shared by every scenario; the per-device batch keeps the global batch at 8."""
    ga = overrides.get("gradient_accumulation_steps", 1)
    base: dict[str, Any] = dict(
        output_dir=str(out), per_device_train_batch_size=GLOBAL_BATCH // (WORLD * ga),
        per_device_eval_batch_size=2, num_train_epochs=2, learning_rate=0.05, logging_steps=1,
        save_strategy="no", report_to=[], disable_tqdm=True, seed=0, use_cpu=True, max_grad_norm=1.0,
    )
    base.update(overrides)
    return TrainingArguments(**base)


def weights_of(trainer: Trainer) -> dict[str, list]:
    """The consolidated weights (a collective for sharded backends: every rank calls it)."""
    state = trainer.backend.full_state_dict() if trainer.backend.caps.sharded_state else None
    if state is None:
        state = trainer.model.state_dict()
    return {k: v.detach().float().cpu().reshape(-1).tolist() for k, v in state.items()}


def losses_of(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def train(out: Path, **overrides: Any) -> tuple[Trainer, dict[str, Any]]:
    """Train TinyNet on 48 samples (6 optimizer steps) and return the trainer and its losses/weights."""
    resume = overrides.pop("resume_from_checkpoint", None)
    torch.manual_seed(0)  # the same initial weights on every rank and in every scenario
    trainer = Trainer(model=TinyNet(), args=make_args(out, **overrides), train_dataset=make_dataset(48))
    trainer.train(resume_from_checkpoint=resume)
    return trainer, {"losses": losses_of(trainer), "weights": weights_of(trainer),
                     "global_step": trainer.state.global_step}


def with_eval(trainer: Trainer, result: dict[str, Any]) -> dict[str, Any]:
    """Add the evaluation loss and predictions on 13 samples (an odd length: the last global batch is padded)."""
    output = trainer.predict(make_dataset(13, seed=2))
    result["eval_loss"] = output.metrics["test_loss"]
    result["predictions"] = output.predictions.tolist()
    return result


def scenario_eval(out: Path) -> dict[str, Any]:
    """Prediction only, with the initial weights (identical in every process)."""
    torch.manual_seed(0)
    trainer = Trainer(model=TinyNet(), args=make_args(out))
    output = trainer.predict(make_dataset(13, seed=2))
    return {"predictions": output.predictions.tolist(), "label_ids": output.label_ids.tolist(),
            "test_loss": output.metrics["test_loss"], "num_samples": len(output.predictions)}


def scenario_ddp(out: Path) -> dict[str, Any]:
    return with_eval(*train(out))


def scenario_ddp_ga(out: Path) -> dict[str, Any]:
    return train(out, gradient_accumulation_steps=2)[1]


def scenario_zero(out: Path) -> dict[str, Any]:
    return train(out, sharded_ddp="simple")[1]


def scenario_fsdp_full(out: Path) -> dict[str, Any]:
    return with_eval(*train(out, fsdp="full_shard auto_wrap"))


def scenario_fsdp_grad_op(out: Path) -> dict[str, Any]:
    return train(out, fsdp="shard_grad_op auto_wrap",
                 fsdp_config={"min_num_params": 50, "cpu_ram_efficient_loading": True, "forward_prefetch": True})[1]


def scenario_fsdp_ga(out: Path) -> dict[str, Any]:
    return train(out, gradient_accumulation_steps=2, fsdp="full_shard auto_wrap",
                 fsdp_config={"activation_checkpointing": True})[1]


def scenario_fsdp_hybrid_offload(out: Path) -> dict[str, Any]:
    """hybrid_shard (a 1 x 2 mesh on one node) with the CPU offload policy."""
    return train(out, fsdp="hybrid_shard offload auto_wrap")[1]


def _resume_scenario(out: Path, **backend: Any) -> dict[str, Any]:
    """Full run saving every 3 of its 12 steps, then a run resumed from checkpoint-3, then save_model."""
    _, full = train(out / "full", save_strategy="steps", save_steps=3, **backend)
    trainer, resumed = train(out / "resumed", resume_from_checkpoint=str(out / "full" / "checkpoint-3"), **backend)
    trainer.save_model(str(out / "final"))
    return {"full": full, "resumed": resumed, "final_dir": str(out / "final")}


def scenario_resume_fsdp(out: Path) -> dict[str, Any]:
    result = _resume_scenario(out, fsdp="full_shard auto_wrap")
    # An interrupted save: the newest checkpoint (12) is complete but its sharded state is missing -> fall back to
    # checkpoint-9 and train its last 3 steps again.
    if RANK == 0:
        shutil.rmtree(out / "full" / "checkpoint-12" / "fsdp_state")
    torch.distributed.barrier()
    _, fallback = train(out / "full", resume_from_checkpoint=True, fsdp="full_shard auto_wrap")
    result["fallback"] = fallback
    return result


def scenario_resume_zero(out: Path) -> dict[str, Any]:
    return _resume_scenario(out, sharded_ddp="simple")


def _log_probe(out: Path, **levels: Any) -> dict[str, Any]:
    Trainer(model=TinyNet(), args=make_args(out, **levels), train_dataset=make_dataset(8))
    probe = logging.getLogger("trainwell.probe")
    probe.info("PROBE-INFO rank%d", RANK)
    probe.warning("PROBE-WARNING rank%d", RANK)
    sys.stdout.flush()
    return {"level": logging.getLogger("trainwell").level}


def scenario_log_warning(out: Path) -> dict[str, Any]:
    return _log_probe(out, log_level="warning", log_level_replica="error")


def scenario_log_info(out: Path) -> dict[str, Any]:
    return _log_probe(out, log_level="info", log_level_replica="error")


SCENARIOS: dict[str, Callable[[Path], dict[str, Any]]] = {
    name[len("scenario_"):]: fn for name, fn in globals().items() if name.startswith("scenario_")
}


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    for name in argv[1:]:
        print(f"=== {name} ===", flush=True)
        result = SCENARIOS[name](out / name)
        if RANK == 0:
            (out / f"{name}.json").write_text(json.dumps(result))
        sys.stdout.flush()
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
