"""Under mixed precision the eval loop sees float32 model outputs, as upstream's (accelerate wraps the model's forward
in ``convert_outputs_to_fp32``): ``compute_metrics`` gets float32 arrays, ``preprocess_logits_for_metrics`` and
``compute_loss_func`` get float32 logits although the forward ran in autocast. A model that returns half logits
without mixed precision is left as it is (float16 stays float16; bfloat16 becomes float32, numpy has none), as
upstream leaves it. Each case runs trainwell and ``transformers.Trainer`` on the same model and compares."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import trainwell

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


class Classifier(nn.Module):
    """A linear classifier; ``out_dtype`` casts its logits (a model computing in half precision)."""

    def __init__(self, out_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)
        self.out_dtype = out_dtype

    def forward(self, x, labels=None):
        logits = self.linear(x)
        if self.out_dtype is not None:
            logits = logits.to(self.out_dtype)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def _data(n: int = 10) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return [{"x": x[i], "labels": torch.tensor(i % 3)} for i in range(n)]


def _seen(trainer_cls: type, tmp_path, *, out_dtype=None, loss_func: bool = False, **opts) -> dict[str, str]:
    """The dtypes each user hook was given during one evaluate()."""
    seen: dict[str, str] = {}

    def compute_metrics(pred):
        seen["metrics"] = str(pred.predictions.dtype)
        return {"n": float(len(pred.label_ids))}

    def preprocess(logits, labels):
        seen["preprocess"] = str(logits.dtype).replace("torch.", "")
        return logits

    def compute_loss_func(outputs, labels, num_items_in_batch=None):
        seen["loss_func"] = str(outputs["logits"].dtype).replace("torch.", "")
        return F.cross_entropy(outputs["logits"].float(), labels)

    args_cls = transformers.TrainingArguments if trainer_cls is transformers.Trainer else trainwell.TrainingArguments
    args = args_cls(output_dir=str(tmp_path / trainer_cls.__module__), per_device_eval_batch_size=4,
                    report_to="none", use_cpu=True, disable_tqdm=True, **opts)
    trainer = trainer_cls(model=Classifier(out_dtype), args=args, eval_dataset=_data(),
                          compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess,
                          compute_loss_func=compute_loss_func if loss_func else None)
    metrics = trainer.evaluate()
    assert metrics["eval_n"] == 10.0 and np.isfinite(metrics["eval_loss"])
    return seen


@pytest.mark.parametrize("loss_func", [False, True], ids=["model_loss", "compute_loss_func"])
def test_bf16_autocast_outputs_reach_the_hooks_as_float32(tmp_path, loss_func):
    ours = _seen(trainwell.Trainer, tmp_path, loss_func=loss_func, bf16=True)
    theirs = _seen(transformers.Trainer, tmp_path, loss_func=loss_func, bf16=True)
    assert ours == theirs
    assert ours["metrics"] == "float32" and ours["preprocess"] == "float32"
    if loss_func:
        assert ours["loss_func"] == "float32"


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16], ids=["fp16_model", "bf16_model"])
@pytest.mark.parametrize("bf16", [False, True], ids=["no_amp", "bf16_amp"])
def test_half_logits_of_the_model_as_upstream(tmp_path, out_dtype, bf16):
    ours = _seen(trainwell.Trainer, tmp_path, out_dtype=out_dtype, bf16=bf16)
    theirs = _seen(transformers.Trainer, tmp_path, out_dtype=out_dtype, bf16=bf16)
    assert ours == theirs
    expected = "float16" if out_dtype == torch.float16 and not bf16 else "float32"
    assert ours["metrics"] == expected


def test_upcast_half_keeps_the_output_types():
    from collections import namedtuple

    from transformers.modeling_outputs import SequenceClassifierOutput

    from trainwell.loops.nested import upcast_half

    half, full, ids = torch.ones(2, dtype=torch.bfloat16), torch.ones(2), torch.ones(2, dtype=torch.long)
    out = upcast_half(SequenceClassifierOutput(loss=half[0], logits=half))
    assert type(out) is SequenceClassifierOutput and out.logits.dtype == torch.float32 and out[1] is out.logits
    pair = namedtuple("Pair", "a b")
    got = upcast_half((pair(half.half(), ids), [full], {"x": half}))
    assert type(got[0]) is pair and got[0].a.dtype == torch.float32 and got[0].b is ids
    assert got[1][0] is full and got[2]["x"].dtype == torch.float32
    same = (full, ids)
    assert upcast_half(same) is same
