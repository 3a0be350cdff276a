"""Under fp16/bf16 autocast the training step's loss hooks see float32 model
outputs, as upstream's (accelerate's ``Accelerator.prepare_model`` wraps the forward in ``convert_outputs_to_fp32``):
``compute_loss_func``, the label smoother and the outputs ``compute_loss(return_outputs=True)`` gives an override
get float32 logits although the forward ran in bf16 autocast. Each case trains trainwell and ``transformers.Trainer``
on the same model (bf16 autocast on the CPU) and compares the dtypes seen; without mixed precision nothing changes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import trainwell

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(4, 3)
        self.config = SimpleNamespace(problem_type=None)  # upstream reads config.problem_type for label smoothing

    def forward(self, x, labels=None):
        logits = self.linear(x)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def _data(n: int = 8) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 4, generator=g)
    return [{"x": x[i], "labels": torch.tensor(i % 3)} for i in range(n)]


def _seen(lib, tmp_path, hook: str, **opts) -> list[str]:
    """The logits dtypes ``hook`` was given during two training steps."""
    seen: list[str] = []

    def compute_loss_func(outputs, labels, num_items_in_batch=None):
        seen.append(str(outputs["logits"].dtype))
        return F.cross_entropy(outputs["logits"].float(), labels)

    class Recording(lib.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                                 num_items_in_batch=num_items_in_batch)
            if hook == "outputs":
                seen.append(str(outputs["logits"].dtype))
            return (loss, outputs) if return_outputs else loss

    args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), per_device_train_batch_size=4, max_steps=2,
                                 report_to="none", use_cpu=True, disable_tqdm=True, save_strategy="no",
                                 label_smoothing_factor=0.1 if hook == "label_smoother" else 0.0, **opts)
    trainer = Recording(model=Classifier(), args=args, train_dataset=_data(),
                        compute_loss_func=compute_loss_func if hook == "compute_loss_func" else None)
    if hook == "label_smoother":
        smoother = trainer.label_smoother

        def recording_smoother(outputs, labels, **kwargs):
            seen.append(str(outputs["logits"].dtype))
            return smoother(outputs, labels, **kwargs)

        trainer.label_smoother = recording_smoother
    trainer.train()
    return seen


@pytest.mark.slow  # over a second
@pytest.mark.parametrize("hook", ["compute_loss_func", "label_smoother", "outputs"])
def test_bf16_training_hooks_get_float32_logits_as_upstream(tmp_path, hook):
    ours = _seen(trainwell, tmp_path, hook, bf16=True)
    theirs = _seen(transformers, tmp_path, hook, bf16=True)
    assert ours == theirs == ["torch.float32"] * 2


@pytest.mark.slow  # over a second
def test_without_mixed_precision_nothing_is_hooked(tmp_path):
    ours = _seen(trainwell, tmp_path, "outputs")
    assert ours == _seen(transformers, tmp_path, "outputs") == ["torch.float32"] * 2
    from trainwell.loops.train_hooks import upcasts_outputs

    assert not upcasts_outputs(trainwell.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"))


class Recorder(Classifier):
    """Records, per forward call, whether it ran in autocast; the logits it returns are as computed."""

    def __init__(self, seen: list[str], name: str) -> None:
        super().__init__()
        self.seen, self.name = seen, name

    def forward(self, x, labels=None):
        self.seen.append(f"{self.name}:{torch.is_autocast_enabled('cpu')}")
        return super().forward(x, labels)


def _outside_calls(lib, tmp_path) -> list[str]:
    """A library's own prediction_step and a reference model prepared with ``evaluation_mode=True``, both calling
    the forward outside the Trainer's steps (TRL's ORPO / OnlineDPO): per call, autocast on or off and the
    dtype the caller got."""
    seen: list[str] = []

    class Library(lib.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.ref_model = self.accelerator.prepare_model(Recorder(seen, "ref"), evaluation_mode=True)

        def training_step(self, model, inputs, num_items_in_batch=None):
            with torch.no_grad():
                seen.append(str(self.ref_model(inputs["x"])["logits"].dtype))
            return super().training_step(model, inputs, num_items_in_batch)

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            with torch.no_grad():
                outputs = model(**inputs)
            seen.append(str(outputs["logits"].dtype))
            return outputs["loss"].detach(), None, None

    args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), per_device_train_batch_size=4,
                                 per_device_eval_batch_size=8, max_steps=1, report_to="none", use_cpu=True,
                                 disable_tqdm=True, save_strategy="no", bf16=True)
    trainer = Library(model=Recorder(seen, "model"), args=args, train_dataset=_data(), eval_dataset=_data())
    trainer.train()
    trainer.evaluate()
    return seen


@pytest.mark.slow  # over a second
def test_bf16_forward_called_outside_the_trainers_steps_runs_in_autocast_as_upstream(tmp_path):
    """accelerate's prepare_model replaces the forward (autocast, float32 outputs): a library's prediction_step
    and a reference model it prepared compute in bf16 too, and get float32 logits."""
    ours = _outside_calls(trainwell, tmp_path)
    assert ours == _outside_calls(transformers, tmp_path)
    assert ours == ["ref:True", "torch.float32", "model:True", "model:True", "torch.float32"]
