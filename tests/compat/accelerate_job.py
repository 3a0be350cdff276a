"""A training script started by ``accelerate launch --config_file cfg.yaml`` in ``test_accelerate_launch.py``.

Usage: ``accelerate launch --config_file CFG accelerate_job.py OUT_DIR [TrainingArguments flags...]``. The script
is what a user writes: it parses TrainingArguments from the command line and trains a tiny model; the
configuration comes only from the launcher. Rank 0 writes ``OUT_DIR/result.json`` with the launcher variables it
saw, the resolved arguments, the backend and precision the run used, and the logged losses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

torch.set_num_threads(1)

from trainwell import HfArgumentParser, Trainer, TrainingArguments  # noqa: E402


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.linear(h))


class TinyNet(nn.Module):
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
        logits = self.head(h).sum(-1)
        self.seen_dtype = str(h.dtype)  # the compute dtype the forward really ran in
        out = {"logits": logits}
        if labels is not None:
            out = {"loss": nn.functional.mse_loss(logits.float(), labels), **out}
        return out


def _engine_settings(engine: object) -> dict[str, object] | None:
    """What the DeepSpeed engine really runs with (None for the other backends)."""
    if engine is None:
        return None
    return {"zero_stage": engine.zero_optimization_stage(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
            "gradient_clipping": engine.gradient_clipping(), "bf16": engine.bfloat16_enabled()}


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv[1:])
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 4, generator=g)
    data = [{"x": x[i], "labels": x[i].sum().sin()} for i in range(32)]
    torch.manual_seed(0)
    model = TinyNet()
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    params = list(trainer.model.parameters())
    result = {
        "env": {k: v for k, v in os.environ.items() if k.startswith(("ACCELERATE_", "FSDP_"))},
        "world_size": args.world_size, "bf16": args.bf16, "fp16": args.fp16,
        "fsdp": sorted(getattr(o, "value", o) for o in args.fsdp), "fsdp_config": args.fsdp_config,
        "gradient_accumulation_steps": args.gradient_accumulation_steps, "max_grad_norm": args.max_grad_norm,
        "backend": type(trainer.backend).__name__,
        "mp_param_dtype": str(getattr(getattr(trainer.backend, "mp_policy", None), "param_dtype", None)),
        "param_types": sorted({type(p).__name__ for p in params}),
        "compute_dtype": getattr(trainer.model, "seen_dtype", None),
        "losses": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "ds_engine": _engine_settings(getattr(trainer.backend, "engine", None)),
        "global_step": trainer.state.global_step,
    }
    if args.process_index == 0:
        (out / "result.json").write_text(json.dumps(result, default=str))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
