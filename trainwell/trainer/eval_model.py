"""The model evaluation and prediction run: on the device, cast for ``fp16/bf16_full_eval`` outside training,
sharded by a ZeRO-3 engine, or wrapped in ``nn.DataParallel`` for several GPUs in one process (upstream's
``evaluation_loop`` -> ``_wrap_model(training=False)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import nn

from .init_checks import is_bitsandbytes_quantized

if TYPE_CHECKING:
    from ..args.fields import TrainingArguments
    from ..backends.base import Backend


class EvalModelTrainer(Protocol):
    """What choosing the evaluation model reads of the Trainer (trainer.py imports this module, so the Trainer is not
    named here)."""

    args: TrainingArguments
    model: nn.Module
    backend: Backend
    is_in_train: bool
    is_model_parallel: bool
    place_model_on_device: bool
    _tw_n_gpu: int

    def _adopt_input_dtype(self) -> None: ...


def model_for_eval(trainer: EvalModelTrainer) -> nn.Module:
    """The model to run inference with: on the device, cast for ``fp16/bf16_full_eval`` outside training."""
    model = trainer.model
    if not trainer.is_in_train and trainer.backend.caps.sharded_state:
        # ZeRO-3 inference: the backend shards the model (a no-op when training already did)
        engine = trainer.backend.prepare_model(model, training=False)
        trainer._adopt_input_dtype()
        return engine
    if not trainer.is_in_train:
        if trainer.args.fp16_full_eval:
            model = model.to(dtype=torch.float16, device=trainer.args.device)
        elif trainer.args.bf16_full_eval:
            model = model.to(dtype=torch.bfloat16, device=trainer.args.device)
        elif trainer.place_model_on_device or (trainer.backend.caps.places_model and not trainer.is_model_parallel):
            model = model.to(trainer.args.device)  # (DeepSpeed ZeRO-1/2 before training: upstream's engine places it)
    if trainer._tw_n_gpu > 1 and not isinstance(model, nn.DataParallel) and not is_bitsandbytes_quantized(model):
        # Upstream's evaluation_loop -> _wrap_model(training=False): with several GPUs in one process the model is
        # wrapped in nn.DataParallel for evaluation too (not a quantized one), so the n_gpu-times batch is split
        # over the GPUs instead of running on GPU 0 alone (model parallelism forced n_gpu to 1 already)
        model = nn.DataParallel(model)
    return model
