"""Loss helpers: extracting the loss from a model's output, and label smoothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn import functional as F


def extract_loss(outputs: Any, inputs: Mapping[str, Any], label_names: list[str]) -> torch.Tensor:
    """The loss in ``outputs``: first element of a tuple/list, ``"loss"`` of a mapping, or a ``.loss`` attribute.

    Raises a ValueError that says what the model must return (and whether the batch even had labels).
    """
    loss = None
    if type(outputs) is dict:  # fast path for the most common output
        loss = outputs.get("loss")
        if isinstance(loss, torch.Tensor):
            return loss
    if isinstance(outputs, Mapping):
        loss = outputs.get("loss")
    elif isinstance(outputs, (tuple, list)):
        loss = outputs[0] if outputs else None
    elif isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
        loss = outputs
    else:
        loss = getattr(outputs, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    if isinstance(loss, torch.Tensor) and loss.numel() > 1:  # (DataParallel gathers one loss per device)
        _refuse_loss_not_first(outputs, loss)
        return loss
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        raise ValueError(
            f"The model returned its loss as a Python {type(loss).__name__} ({loss!r}), not a tensor: a float has no "
            "gradient to train on. Return the loss tensor itself (no .item() or float()), e.g. "
            "{'loss': torch.nn.functional.cross_entropy(logits, labels)}.")
    keys = sorted(inputs) if isinstance(inputs, Mapping) else []
    missing = [name for name in label_names if name not in keys]
    hint = (f"the batch has no {missing} column (batch keys: {keys}); add labels to the dataset items, set "
            f"label_names=[...], or override compute_loss" if missing else
            f"the batch had keys {keys}")
    if not label_names:  # upstream's rule: a forward without a label parameter gets none, its label column dropped
        hint += ("; its forward takes no label argument, so label_names is [] and a label column of the dataset is "
                 "dropped as unused: take it in forward (def forward(self, ..., labels=None)), set label_names, or "
                 "compute the loss outside the model with compute_loss_func")
    kind = type(outputs).__name__ if not isinstance(outputs, Mapping) else f"a mapping with keys {sorted(outputs)}"
    raise ValueError(
        f"The model did not return a loss (it returned {kind}). A model trained by Trainer must return its loss "
        f"when given labels: as the first element of a tuple, under 'loss' in a dict, or as `.loss`; {hint}."
    )


def _refuse_loss_not_first(outputs: Any, first: torch.Tensor) -> None:
    """A tuple whose first element is not the loss but holds a single-number tensor further on: say where it is."""
    if not isinstance(outputs, (tuple, list)):
        return
    at = [i for i, item in enumerate(outputs) if isinstance(item, torch.Tensor) and item.dim() == 0
          and item.is_floating_point()]
    if at:
        raise ValueError(
            f"The model returned a {type(outputs).__name__} whose first element is a tensor of shape "
            f"{tuple(first.shape)}, not the loss; Trainer reads the loss from the first element and the single number "
            f"at position {at[0]} looks like it: return (loss, logits, ...) with the loss first, or a dict "
            "{'loss': loss, 'logits': logits}.")
    if first.dim() >= 2:  # per-device losses (DataParallel) are 1-D: this is an output such as logits
        raise ValueError(
            f"The model returned a {type(outputs).__name__} of {len(outputs)} element(s) and Trainer takes the first "
            f"as the loss, but it is a tensor of shape {tuple(first.shape)} (logits?), and no element is a single "
            "number: compute the loss in forward when labels are given and return (loss, logits, ...) with the loss "
            "first, or {'loss': loss, 'logits': logits}; or compute it outside the model (compute_loss_func, or a "
            "compute_loss override). Reducing that tensor (loss.mean()) would train on the mean output.")


def explain_backward_error(error: RuntimeError, loss: Any, model_name: str) -> ValueError | None:
    """The cause and the fix when ``loss.backward()`` refused the loss of ``model_name`` (not a single number, or no
    gradient); None for any other error."""
    text = str(error)
    if not isinstance(loss, torch.Tensor):
        return None
    if "only for scalar outputs" in text and loss.dim() != 0:
        return ValueError(
            f"The loss of {model_name} has shape {tuple(loss.shape)}, not a single number, so backward() cannot start "
            "from it: "
            "reduce it in the model or in compute_loss (e.g. loss.mean(), or reduction='mean' in the loss function).")
    if "does not require grad" in text and not loss.requires_grad:
        return ValueError(
            f"The loss of {model_name} has no gradient (loss.requires_grad is False), likely because the parameters "
            "it depends on are frozen (requires_grad=False), its forward runs under torch.no_grad() or "
            "torch.inference_mode(), or the loss was detached (.detach(), .item(), torch.tensor(...)): compute it "
            "from the model's trainable parameters with gradients on.")
    return None


@dataclass
class LabelSmoother:
    """Cross entropy with label smoothing ``epsilon`` over the model's logits, ignoring ``ignore_index`` labels
    (upstream's ``transformers.trainer_pt_utils.LabelSmoother``: same fields, call and numbers)."""

    epsilon: float = 0.1
    ignore_index: int = -100

    def __call__(self, model_output: Any, labels: torch.Tensor, shift_labels: bool = False,
                 num_items_in_batch: int | torch.Tensor | None = None) -> torch.Tensor:
        """Smoothed loss for ``labels`` (shifted by one for causal language models when ``shift_labels``), divided
        by ``num_items_in_batch`` when given (the labels of the whole accumulated batch), else by this batch's."""
        if isinstance(model_output, Mapping):
            logits = model_output["logits"]
        elif isinstance(model_output, (tuple, list)):
            logits = model_output[0]
        else:
            logits = model_output.logits
        if shift_labels:
            logits = logits[..., :-1, :].contiguous()
            labels = labels[..., 1:].contiguous()
        log_probs = -F.log_softmax(logits.float(), dim=-1)
        if labels.dim() == log_probs.dim() - 1:
            labels = labels.unsqueeze(-1)
        padding_mask = labels.eq(self.ignore_index)
        nll = log_probs.gather(dim=-1, index=labels.clamp(min=0)).masked_fill(padding_mask, 0.0)
        smoothed = log_probs.sum(dim=-1, keepdim=True).masked_fill(padding_mask, 0.0)
        if num_items_in_batch is None:
            denominator: Any = padding_mask.numel() - padding_mask.long().sum()
        elif isinstance(num_items_in_batch, torch.Tensor):
            denominator = num_items_in_batch.to(nll.device)  # (the count may live on another device)
        else:
            denominator = num_items_in_batch
        nll = nll.sum() / denominator
        smoothed = smoothed.sum() / (denominator * log_probs.shape[-1])
        return (1 - self.epsilon) * nll + self.epsilon * smoothed


def explain_rejected_labels(error: TypeError, model: Any, inputs: Mapping[str, Any],
                            label_names: Sequence[str]) -> ValueError | None:
    """The cause and the fix when ``model(**inputs)`` refused a label column (``forward(self, x)`` given a labelled
    batch: Python only says "unexpected keyword argument 'labels'"); None for any other ``TypeError``."""
    import inspect

    from .model_utils import unwrap_for_signature

    rejected = [name for name in (*label_names, "labels") if name in inputs and f"'{name}'" in str(error)]
    if "unexpected keyword argument" not in str(error) or not rejected:
        return None
    try:
        signature = f"forward{inspect.signature(unwrap_for_signature(model).forward)}"
    except (TypeError, ValueError):
        signature = "forward"
    name = rejected[0]
    return ValueError(
        f"The model's {signature} does not take {name!r}, but the batch has it (the dataset items carry labels). "
        f"Let the model compute its loss: def forward(self, ..., {name}=None) returning {{'loss': ..., 'logits': "
        f"...}}; or compute it outside the model with Trainer(compute_loss_func=...) or by overriding compute_loss.")


IGNORE_INDEX = -100


def all_labels_ignored(batch: Mapping[str, Any], label_names: Sequence[str]) -> str | None:
    """The name of an integer label tensor of ``batch`` whose every entry is ``-100`` (ignored by the loss), else
    None. A loss averaged over no label is 0 (or nan): a run trained on such batches learns nothing, silently."""
    for name in label_names:
        labels = batch.get(name) if isinstance(batch, Mapping) else None
        if (isinstance(labels, torch.Tensor) and labels.numel() > 0 and not labels.is_floating_point()
                and bool((labels == IGNORE_INDEX).all())):
            return name
    return None
