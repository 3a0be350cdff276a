"""``num_items_in_batch`` at ``gradient_accumulation_steps=1``: the label count, as upstream passes it.

Upstream counts the labels (``labels != -100``; a causal LM's shifted labels) of every step's batch whenever the
model's forward takes loss keyword arguments (``**kwargs``) and hands the count to ``training_step`` and
``compute_loss``, so an override written as ``loss_sum / num_items_in_batch`` works without accumulation too. The
model's own loss is unchanged (its mean over the batch, as before). Oracle: ``transformers.Trainer`` on the same body
(the counts passed, the logged losses, the final weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import SequentialSampler

import trainwell

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB, CLASSES, BATCH, STEPS = 13, 4, 4, 3


class Tagger(nn.Module):
    """Tags tokens; its own loss is the mean over the labelled tokens; its forward takes ``**kwargs`` (so upstream
    counts the items of each batch)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, CLASSES)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any) -> dict:
        logits = self.head(self.emb(input_ids))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100)
        return out


def dataset() -> list[dict[str, torch.Tensor]]:
    """Rows of 9 tokens, 7 labelled (28 labels per batch of 4), but the last batch's rows are 6 labelled."""
    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(BATCH * STEPS):
        labels = torch.randint(0, CLASSES, (9,), generator=g)
        labels[:2 if i < 2 * BATCH else 3] = -100
        rows.append({"input_ids": torch.randint(0, VOCAB, (9,), generator=g), "labels": labels})
    return rows


def trainer_class(module: Any, *, override: bool) -> type:
    """``module.Trainer`` reading the data in order; with ``override``, a ``compute_loss`` of the labels' summed
    cross-entropy over ``num_items_in_batch``; it records every count it is given."""

    class Recording(module.Trainer):
        seen: list[float | None]

        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            return SequentialSampler(self.train_dataset)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if model.training:
                self.seen.append(None if num_items_in_batch is None else float(num_items_in_batch))
            if not override:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            labels = inputs["labels"]
            outputs = model(input_ids=inputs["input_ids"])
            loss_sum = F.cross_entropy(outputs["logits"].reshape(-1, CLASSES), labels.reshape(-1),
                                       ignore_index=-100, reduction="sum")
            loss = loss_sum / num_items_in_batch
            return (loss, outputs) if return_outputs else loss

    return Recording


def train(module: Any, tmp_path: Path, *, override: bool) -> tuple[list, list[float], dict[str, torch.Tensor]]:
    args = module.TrainingArguments(output_dir=str(tmp_path / module.__name__), per_device_train_batch_size=BATCH,
                                    num_train_epochs=1, learning_rate=0.1, optim="sgd", logging_steps=1,
                                    report_to="none", use_cpu=True, save_strategy="no", disable_tqdm=True,
                                    gradient_accumulation_steps=1)
    model = Tagger()
    trainer = trainer_class(module, override=override)(model=model, args=args, train_dataset=dataset())
    trainer.seen = []
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return trainer.seen, losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow  # over a second
@pytest.mark.parametrize("override", [True, False], ids=["sum_over_num_items", "model_mean"])
def test_single_step_num_items_is_the_label_count_as_upstream(tmp_path: Path, override: bool) -> None:
    ours, upstream = train(trainwell, tmp_path, override=override), train(transformers, tmp_path, override=override)
    assert ours[0] == upstream[0] == [28.0, 28.0, 24.0]
    assert ours[1] == pytest.approx(upstream[1], rel=1e-6)
    for key, value in upstream[2].items():
        torch.testing.assert_close(ours[2][key], value, rtol=1e-6, atol=1e-7)
