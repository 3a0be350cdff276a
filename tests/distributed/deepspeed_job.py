"""The 2-process DeepSpeed job run by ``test_deepspeed.py`` under ``torchrun --nproc_per_node=2`` (gloo, CPU).

One launch runs every scenario in turn (process start-up and ``import deepspeed`` dominate the cost) and rank 0 writes
the results as JSON to ``argv[1]``; the work folder is ``argv[2]``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from types import SimpleNamespace

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)

from trainwell.args.fields import TrainingArguments  # noqa: E402
from trainwell.trainer.trainer import Trainer  # noqa: E402
from trainwell.trainer_utils import set_seed  # noqa: E402

STEPS = 6


class MLP(nn.Module):
    """4 -> 16 -> 1 regression with a transformers-like ``config.hidden_size``."""

    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(hidden_size=16)
        self.fc1 = nn.Linear(4, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor | None]:
        pred = self.fc2(torch.tanh(self.fc1(x))).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels) if labels is not None else None, "logits": pred}


def make_data(n: int = 64) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0]) + 0.1 * torch.randn(n, generator=gen)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def zero(stage: int, **extra: object) -> dict:
    config = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 10 ** 9,
              "zero_optimization": {"stage": stage, "reduce_bucket_size": "auto"}}
    if stage == 3:
        config["zero_optimization"].update(stage3_param_persistence_threshold=0,
                                           stage3_prefetch_bucket_size="auto",
                                           stage3_gather_16bit_weights_on_model_save=True)
    config["zero_optimization"].update(extra)
    return config


def make_trainer(out: str, deepspeed: dict | None, **kw: object) -> Trainer:
    set_seed(0)
    options = dict(output_dir=out, use_cpu=True, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                   max_steps=STEPS, learning_rate=0.05, logging_steps=1, save_strategy="no", seed=0, report_to="none",
                   disable_tqdm=True, deepspeed=deepspeed, warmup_steps=1, ddp_backend="gloo")
    args = TrainingArguments(**{**options, **kw})
    return Trainer(model=MLP(), args=args, train_dataset=make_data())


def curve(trainer: Trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def weights(trainer: Trainer) -> dict[str, list]:
    return {k: v.float().flatten().tolist() for k, v in trainer.backend.full_state_dict().items()}


def train(work: str, name: str, deepspeed: dict | None, **kw: object) -> dict:
    trainer = make_trainer(os.path.join(work, name), deepspeed, **kw)
    trainer.train()
    norms = [entry.get("grad_norm") for entry in trainer.state.log_history if "loss" in entry]
    return {"curve": curve(trainer), "weights": weights(trainer), "grad_norms": norms}


def resume_scenario(work: str, stage: int = 2) -> dict:
    """Save at step 3 while training 6 steps, then a fresh trainer resumes from checkpoint-3."""
    out = os.path.join(work, f"resume{stage}")
    full = make_trainer(out, zero(stage), save_strategy="steps", save_steps=3)
    full.train()
    ckpt = os.path.join(out, "checkpoint-3")
    resumed = make_trainer(os.path.join(work, f"resumed{stage}"), zero(stage))
    resumed.train(resume_from_checkpoint=ckpt)
    files = sorted(os.listdir(ckpt))
    return {"full": curve(full), "resumed": curve(resumed), "files": files,
            "full_weights": weights(full), "resumed_weights": weights(resumed)}


def zero3_scenario(work: str) -> dict:
    """ZeRO-3: train + checkpoint (for zero_to_fp32) and predict without training vs the plain model."""
    out = os.path.join(work, "z3")
    trainer = make_trainer(out, zero(3), save_strategy="steps", save_steps=STEPS)
    trainer.train()
    gathered = weights(trainer)
    sharded = [tuple(p.shape) for p in trainer.model.parameters()]
    set_seed(0)
    plain = MLP()
    data = make_data(10)
    with torch.no_grad():
        expected = plain(torch.stack([d["x"] for d in data]))["logits"].tolist()
    set_seed(0)
    infer = make_trainer(os.path.join(work, "z3infer"), zero(3), per_device_eval_batch_size=3)
    predictions = infer.predict(data).predictions.tolist()
    return {"curve": curve(trainer), "weights": gathered, "checkpoint": os.path.join(out, f"checkpoint-{STEPS}"),
            "sharded_shapes": sharded, "predictions": predictions, "expected": expected}


def zero3_model_init_scenario(work: str) -> dict:
    """ZeRO-3 with ``model_init``: the model is built under ``zero.Init`` (partitioned from the start) and trains."""
    set_seed(0)
    options = dict(output_dir=os.path.join(work, "z3init"), use_cpu=True, per_device_train_batch_size=4,
                   gradient_accumulation_steps=2, max_steps=STEPS, learning_rate=0.05, logging_steps=1,
                   save_strategy="no", seed=0, report_to="none", disable_tqdm=True, deepspeed=zero(3),
                   warmup_steps=1, ddp_backend="gloo")
    trainer = Trainer(model_init=MLP, args=TrainingArguments(**options), train_dataset=make_data())
    partitioned = all(hasattr(p, "ds_id") for p in trainer.model.parameters())
    trainer.train()
    return {"partitioned_at_init": partitioned, "curve": curve(trainer), "weights": weights(trainer)}


def main() -> None:
    result_path, work = sys.argv[1], sys.argv[2]
    results: dict = {}
    scenarios = {
        "ddp": lambda: train(work, "ddp", None),
        "zero0": lambda: train(work, "zero0", zero(0)),
        "zero1": lambda: train(work, "zero1", zero(1)),
        "zero2": lambda: train(work, "zero2", zero(2)),
        "zero2_offload": lambda: train(work, "zero2_offload", zero(2, offload_optimizer={"device": "cpu"})),
        "resume": lambda: resume_scenario(work),
        "zero3": lambda: zero3_scenario(work),
        "resume_zero3": lambda: resume_scenario(work, 3),
        "zero3_model_init": lambda: zero3_model_init_scenario(work),
    }
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else list(scenarios)
    for name in only:
        try:
            results[name] = scenarios[name]()
        except Exception:  # keep going: each test reports its own scenario's failure
            results[name] = {"error": traceback.format_exc()}
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        with open(result_path, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
    import torch.distributed as dist

    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    # DeepSpeed's CPU communication threads can abort the interpreter's teardown ("terminate called without an
    # active exception"); everything is written, so leave without it.
    os._exit(0)


if __name__ == "__main__":
    main()
