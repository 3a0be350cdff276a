"""How each micro-batch's loss is scaled so that one accumulation window updates like one big batch of its examples.

A model's loss is one of two kinds, and the window is normalised accordingly:

* it honours ``num_items_in_batch`` (``sum / num_items_in_batch``, as transformers' causal LMs): the model gets the
  window's count of exactly the items its loss averages over (for a causal LM the *shifted* labels,
  ``labels[..., 1:] != -100``), summed over the ranks with ``average_tokens_across_devices``;
* it is a mean over its own items (a masked LM, a token or sequence classifier, T5, any plain module): each
  micro-batch's mean is weighted by its share of the window's labelled items (its rows when there are no labels).

Which kind, and which items, is decided once per ``train()`` from what the model does (:func:`probe_loss_rule`): a
model may declare the kind (upstream's ``accepts_loss_kwargs`` class attribute); otherwise no-grad forwards of the
first micro-batch in eval mode, under ``torch.random.fork_rng``, tell whether the loss moves with
``num_items_in_batch`` and, if it does, by how many items the model's own mean divides; for a mean, the losses of
the batch's two halves of rows tell which count weighs them into the whole. Neither the random streams, the data nor
the weights change. :class:`WindowScaler` then gives every optimizer step its ``num_items_in_batch`` and each
micro-batch's divisor.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from ..utils.losses import extract_loss
from ..utils.model_utils import accepts_loss_kwargs, forward_parameters, unwrap_model

logger = logging.getLogger("trainwell")

# num_items_in_batch handed to the probe forward: a value no real item count takes, so sum / N differs from the mean
_PROBE_ITEMS = 1000.5
COUNTS = ("rows", "labels", "shifted")  # what a loss can average over: examples, labelled items, shifted labels


@dataclass(frozen=True)
class LossRule:
    """What the model's loss averages over, and whether it is divided by ``num_items_in_batch``.

    ``takes_num_items``: the loss is ``sum / num_items_in_batch`` when the trainer passes it, else a mean over the
    micro-batch's own items. ``count``: the items, one of :data:`COUNTS` (``"labels"``: ``labels != -100``;
    ``"shifted"``: ``labels[..., 1:] != -100``, a causal LM; ``"rows"``: the examples). ``how`` says where the
    answer came from, for the log line.
    """

    takes_num_items: bool
    count: str = "labels"
    how: str = "assumed"

    def describe(self) -> str:
        """One line for the log."""
        items = {"rows": "examples", "labels": "labels != -100",
                 "shifted": "shifted labels (labels[..., 1:] != -100)"}[self.count]
        kind = ("its loss is divided by num_items_in_batch: each step passes the window's count of "
                if self.takes_num_items else "its loss is a mean: each micro-batch is weighted by its count of ")
        return f"{kind}{items} ({self.how})"


def rows_of(batch: Any) -> int | None:
    """The examples in a micro-batch: the first dimension of its first tensor (None when it cannot be told)."""
    if isinstance(batch, Mapping):
        for value in batch.values():
            if isinstance(value, torch.Tensor) and value.dim():
                return int(value.shape[0])
    return None


def count_items(batch: Any, count: str) -> torch.Tensor | int | None:
    """The items of one micro-batch by ``count`` (:data:`COUNTS`): an int for rows, else a 0-dim integer tensor on
    the labels' device (``shift_labels`` when a collator provides it); None when they cannot be told."""
    if count == "rows" or not isinstance(batch, Mapping):
        return rows_of(batch)
    if isinstance(batch.get("shift_labels"), torch.Tensor):
        return batch["shift_labels"].ne(-100).sum()
    labels = batch.get("labels")
    if not isinstance(labels, torch.Tensor):
        return None
    if count == "shifted" and labels.dim() >= 2:
        labels = labels[..., 1:]
    return labels.ne(-100).sum()


def _causal_by_type(model: nn.Module) -> bool:
    """A causal LM by its type: ``loss_type`` ``ForCausalLM`` (upstream's rule) or a class named ``...CausalLM`` /
    ``...LMHeadModel`` (GPT-2's, which upstream's rule misses), and not an encoder-decoder (which feeds right-shifted
    decoder inputs, so every label is a target)."""
    names = f"{getattr(model, 'loss_type', None) or ''} {type(model).__name__}"
    config = getattr(model, "config", None)
    return ("CausalLM" in names or "LMHeadModel" in names) and not getattr(config, "is_encoder_decoder", False)


def default_count(model: nn.Module) -> str:
    """The items a loss averages over by the model's type (upstream's rule, GPT-2 too): ``"shifted"`` for a causal
    LM, else ``"labels"``; what counts when no forward tells (:func:`probe_loss_rule`)."""
    return "shifted" if _causal_by_type(unwrap_model(model)) else "labels"


@contextlib.contextmanager
def _quiet_eval(model: nn.Module) -> Iterator[None]:
    """Eval mode (no dropout), no gradients, the random streams forked, and every module's mode put back."""
    modes = [(m, m.training) for m in model.modules()]
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            model.eval()
            yield
    finally:
        for module, training in modes:
            module.training = training


def _loss_of(model: nn.Module, inputs: Mapping[str, Any], **extra: Any) -> float:
    loss = extract_loss(model(**inputs, **extra), inputs, ["labels"])
    return float(loss.detach().float().mean())


def _halves(inputs: Mapping[str, Any], rows: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first and second half of a batch's rows (tensors of ``rows`` rows are split; anything else is shared)."""
    cut = rows // 2
    split: list[dict[str, Any]] = [{}, {}]
    for key, value in inputs.items():
        sliced = isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == rows
        split[0][key] = value[:cut] if sliced else value
        split[1][key] = value[cut:] if sliced else value
    return split[0], split[1]


def _fit(candidates: dict[str, float], measured: float) -> str | None:
    """The one candidate count whose prediction matches ``measured`` (to 1e-4, and 10 times closer than any
    candidate predicting something else); None when none does or several predict the same (this batch cannot tell)."""
    scale = max(abs(measured), 1e-12)
    candidates = {name: value for name, value in candidates.items() if math.isfinite(value)}
    errors = sorted((abs(value - measured) / scale, name) for name, value in candidates.items())
    if not errors or errors[0][0] > 1e-4:
        return None
    best_error, best = errors[0]
    for error, name in errors[1:]:
        same = abs(candidates[name] - candidates[best]) / scale <= 1e-6
        if same or error < 10 * max(best_error, 1e-7):
            return None
    return best


def _counts(inputs: Mapping[str, Any]) -> dict[str, float]:
    found = {name: count_items(inputs, name) for name in COUNTS}
    return {name: float(value) for name, value in found.items() if value is not None}


def _probe(model: nn.Module, inputs: Mapping[str, Any], try_num_items: bool) -> tuple[bool | None, str | None, str]:
    """The forwards: (takes num_items or None when untold, the count or None when untold, what was seen)."""
    labels = inputs.get("labels")
    device = labels.device if isinstance(labels, torch.Tensor) else None
    with _quiet_eval(model):
        mean = _loss_of(model, inputs)
        if not math.isfinite(mean) or mean == 0.0:
            return None, None, f"its loss is {mean}"
        if try_num_items:
            over_n = _loss_of(model, inputs, num_items_in_batch=torch.tensor(_PROBE_ITEMS, device=device))
            if math.isfinite(over_n) and not math.isclose(mean, over_n, rel_tol=1e-4):
                items = _PROBE_ITEMS * over_n / mean  # the number the model's own mean divides by
                counts = _counts(inputs)
                return True, _fit(counts, items), f"probed: its mean divides by {items:.6g} items"
        rows = rows_of(inputs)
        if rows is None or rows < 2:
            return False, None, "probed: num_items_in_batch does not change its loss"
        first, second = _halves(inputs, rows)
        loss_a, loss_b = _loss_of(model, first), _loss_of(model, second)
        predicted = {}
        for name in COUNTS:
            a, b = count_items(first, name), count_items(second, name)
            if a is not None and b is not None and float(a) + float(b) > 0:
                # a half without items has no mean (nan): it adds nothing to the whole
                terms = [(float(w), loss) for w, loss in ((a, loss_a), (b, loss_b)) if float(w) > 0]
                predicted[name] = sum(w * loss for w, loss in terms) / sum(w for w, _ in terms)
        return False, _fit(predicted, mean), "probed: a mean over its own items"


def probe_loss_rule(model: nn.Module, inputs: Mapping[str, Any] | None) -> LossRule:
    """Decide the :class:`LossRule` of ``model`` from one prepared micro-batch ``inputs`` (see the module doc).

    A model declaring ``accepts_loss_kwargs`` is believed on whether it takes ``num_items_in_batch``; a forward that
    cannot take it is a mean. Otherwise the loss of the batch without and with ``num_items_in_batch=N`` tells:
    unchanged, a mean; changed, ``N * loss_N / loss`` is the number of items its own mean divides by. The items of a
    mean are told by the loss of each half of the batch's rows (the whole is their mean weighted by the items).
    What the forwards cannot tell (no labels, a zero loss, a failing forward, counts alike in this batch) is decided
    by upstream's rule: the shifted labels for a causal LM, else the labels.
    """
    inner = unwrap_model(model)
    declared = getattr(inner, "accepts_loss_kwargs", None)
    may_take = accepts_loss_kwargs(inner)
    count_by_type = default_count(inner)
    if declared is not None:
        default_takes, how = bool(declared), "declared accepts_loss_kwargs"
    elif may_take:
        default_takes = "num_items_in_batch" in forward_parameters(inner) or _causal_by_type(inner)
        how = "by model type"
    else:
        default_takes, how = False, "its forward takes no num_items_in_batch"
    if not isinstance(inputs, Mapping):
        return LossRule(default_takes, count_by_type, how)
    try:
        takes, count, seen = _probe(inner, inputs, may_take and declared is None)
    except Exception as err:
        takes, count, seen = None, None, f"the probe forward failed ({type(err).__name__}: {err})"
    if declared is not None and takes is not None:
        takes = bool(declared)
    if takes is None:
        return LossRule(default_takes, count_by_type, f"{how}; {seen}")
    if count is None:
        return LossRule(takes, count_by_type, f"{seen}; which items decided by model type")
    return LossRule(takes, count, seen)


_PLAIN_SINGLE: tuple[None, tuple[int]] = (None, (1,))  # a window of one micro-batch, not counted, divided by 1


class WindowScaler:
    """Per optimizer step: the ``num_items_in_batch`` to pass and what each micro-batch's loss is divided by, so that
    the window's summed gradient (over the ranks: DDP averages them) is the gradient of the mean loss of one big
    batch of all its examples.

    A window whose micro-batches cannot be counted by the rule (no labels) weighs them by their rows.

    ``count_single``: a window of one micro-batch whose loss is the model's own mean still passes its count of the
    rule's items as ``num_items_in_batch`` (divisor 1), as upstream passes it without accumulation to a model whose
    forward takes loss keyword arguments: an override of ``compute_loss`` may divide by it.
    """

    def __init__(self, rule: LossRule, *, device: torch.device, world_size: int, across_ranks: bool,
                 count_single: bool = False) -> None:
        self.rule = rule
        self.device = device
        self.world_size = world_size
        self.across_ranks = across_ranks and world_size > 1
        self.count_single = count_single
        self._plain_single = self.single_batch_is_plain()  # read per step: settled for the run

    def single_batch_is_plain(self) -> bool:
        """Whether a window of one micro-batch is the model's own mean as it is: no count, no all-reduce, divisor 1."""
        return not self.across_ranks and not self.rule.takes_num_items

    def window(self, group: Sequence[Any]) -> tuple[torch.Tensor | None, Sequence[Any]]:
        """``(num_items_in_batch or None, divisor of each micro-batch)`` for the micro-batches of one step."""
        if self._plain_single and len(group) == 1:  # the model's own mean as it is
            if not self.count_single:
                return _PLAIN_SINGLE
            count = count_items(group[0], self.rule.count)
            if count is None:
                return _PLAIN_SINGLE
            return torch.as_tensor(count).to(self.device), _PLAIN_SINGLE[1]
        counts = [count_items(batch, self.rule.count) for batch in group]
        if any(c is None for c in counts):
            return None, loss_divisors(group)  # no labels: this rank's rows
        local = [c if isinstance(c, torch.Tensor) else torch.tensor(c) for c in counts]
        summed = torch.stack(local).sum()  # a new tensor (where the labels are): the all-reduce must not alias a count
        if self.across_ranks:
            total = summed.to(self.device)
            dist.all_reduce(total)  # the items of the whole global window (one collective per optimizer step)
            # every rank's micro-batch weighs c / C over the global window; DDP's mean over ranks divides by W
            return (total if self.rule.takes_num_items else None,
                    [total / (c.to(self.device) * self.world_size) for c in local])
        num_items = summed.to(self.device) if self.rule.takes_num_items else None
        if summed.device.type == "cpu":  # python numbers: no copy to the device for a mean loss
            whole = float(summed)
            return num_items, [whole / float(c) for c in local]
        return num_items, [summed / c for c in local]


def _by_share(counts: list[float]) -> list[float]:
    total = sum(counts)
    return [total / c if c > 0 else float(len(counts)) for c in counts]


def loss_divisors(group: Sequence[Any]) -> list[int | float]:
    """What each micro-batch's mean loss is divided by when only rows can be counted, so that the window adds up to
    the mean loss of one big batch of all its examples: the number of micro-batches when they hold as many rows each
    (upstream's divisor), else the window's rows over the micro-batch's own rows."""
    n = len(group)
    if n == 1:
        return [1]
    rows = [rows for rows in map(rows_of, group) if rows is not None]
    if len(rows) < n or min(rows) == max(rows) or min(rows) <= 0:  # fewer: a micro-batch whose rows are untold
        return [n] * n
    return _by_share([float(r) for r in rows])


def data_parallel_num_items(num_items: torch.Tensor | int, n_gpu: int, *,
                            average_tokens_across_devices: bool) -> torch.Tensor | int:
    """``num_items_in_batch`` for a forward through ``nn.DataParallel`` over ``n_gpu`` GPUs, as upstream's
    ``Trainer._get_num_items_in_batch`` (transformers 5) prepares it: without ``average_tokens_across_devices`` each
    replica's share is approximated by ``count // n_gpu``; a 0-dim count becomes shape ``(n_gpu, 1)``, so that
    DataParallel's scatter along dim 0 hands every replica the count (a 0-dim tensor cannot be scattered). With
    ``average_tokens_across_devices`` the replicas divide by the whole count and ``compute_loss`` multiplies the loss
    by ``n_gpu`` (:func:`average_tokens_loss_scale`) before ``training_step`` averages the replicas' losses."""
    if not average_tokens_across_devices:
        num_items = num_items // n_gpu
    if isinstance(num_items, torch.Tensor) and num_items.dim() == 0:
        num_items = num_items.unsqueeze(0).expand(n_gpu, -1)
    return num_items


def average_tokens_loss_scale(world_size: int, n_gpu: int) -> int:
    """What ``compute_loss`` multiplies a loss divided by the count of every device's items by: upstream's
    ``loss *= loss_scale if n_gpu <= 1 else n_gpu`` (``loss_scale``: the processes; DataParallel: the replicas)."""
    return world_size if n_gpu <= 1 else n_gpu


def router_aux_term(model: nn.Module, outputs: Any) -> torch.Tensor | None:
    """``router_aux_loss_coef * aux_loss``: the router (load-balancing) loss a mixture-of-experts model added to its
    loss (transformers' Mixtral, Qwen2/3-MoE, OLMoE...: ``outputs.aux_loss``, the coefficient on the model or its
    config); None for any other model, a zero coefficient, or outputs that are not a mapping (a tuple).

    That term is a mean over the micro-batch's own tokens, not ``sum / num_items_in_batch``: the scaling that makes
    the language-model term of every rank and micro-batch add up to the big batch's (``x world_size``, no division
    over the accumulation window) must leave it out, or it counts ``world_size x micro-batches`` times
    (upstream's transformers#48690).
    """
    if not isinstance(outputs, Mapping):
        return None
    aux = outputs.get("aux_loss")
    if not isinstance(aux, torch.Tensor):
        return None
    inner = unwrap_model(model)
    coef = getattr(inner, "router_aux_loss_coef", None)
    if coef is None:
        coef = getattr(getattr(inner, "config", None), "router_aux_loss_coef", None)
    if not coef:
        return None
    return coef * aux
