"""Evaluation and prediction: the loop behind ``Trainer.evaluate`` / ``Trainer.predict``, gathering and metrics.

How the outputs of the batches are accumulated (padded, concatenated once) is :mod:`trainwell.loops.accumulate`.

Every function takes the trainer (typed by :class:`~trainwell.loops.contract.EvalLoopTrainer`, the members it
uses) and calls its overridable methods (``evaluation_loop``, ``prediction_step``, ``compute_loss``, ...), so a
subclass overriding one of them is honoured; :class:`trainwell.Trainer`'s methods of the same names delegate here.
"""

from __future__ import annotations

import math
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from ..utils.model_utils import unwrap_model
from ..utils.overrides import call_override
from ..utils.reporting import speed_metrics
from ..utils.outputs import EvalLoopOutput, EvalPrediction, PredictionOutput
from .accumulate import OutputAccumulator, find_batch_size
from .gather import _device_of, _is_dist, _round_robin, _sum_across_ranks, gather_parts, keep_rows, predicting_batch
from .nested import nested_detach, nested_map, upcast_half
from .remainder_cut import RemainderCut

if TYPE_CHECKING:
    from torch.utils.data import DataLoader

    from .contract import EvalLoopTrainer


def _shape_of(obj: Any) -> Any:
    """The shapes of a nested output, for error messages."""
    if obj is None:
        return None
    if isinstance(obj, list) and obj and not hasattr(obj[0], "shape"):
        return f"list of {len(obj)} batches"
    return nested_map(lambda x: tuple(x.shape) if hasattr(x, "shape") else type(x).__name__, obj)


# --------------------------------------------------------------------------------------------------------------
# Metrics helpers
# --------------------------------------------------------------------------------------------------------------


def denumpify_detensorize(metrics: Any) -> Any:
    """Turn numpy scalars and one-element tensors/arrays inside (nested) metrics into python numbers."""
    if isinstance(metrics, Mapping):
        return {key: denumpify_detensorize(value) for key, value in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return type(metrics)(denumpify_detensorize(value) for value in metrics)
    if isinstance(metrics, np.generic):
        return metrics.item()
    if isinstance(metrics, np.ndarray) and metrics.size == 1:
        return metrics.item()
    if isinstance(metrics, torch.Tensor) and metrics.numel() == 1:
        return metrics.item()
    return metrics


def _function_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def _prefix_keys(metrics: dict[str, Any], prefix: str) -> dict[str, Any]:
    """``metrics`` with every key prefixed; the keys that had the prefix first, as upstream orders them (it moves each
    renamed key to the end): ``eval_loss`` before ``eval_accuracy`` in the logs a user reads."""
    start = f"{prefix}_"
    out = {key: value for key, value in metrics.items() if key.startswith(start)}
    out.update((f"{start}{key}", value) for key, value in metrics.items() if not key.startswith(start))
    return out


def _mark_last(iterable: Iterable[Any]) -> Iterator[tuple[Any, bool]]:
    """Yield ``(item, is_last)``, looking one item ahead (works without ``__len__``)."""
    iterator = iter(iterable)
    try:
        current = next(iterator)
    except StopIteration:
        return
    for following in iterator:
        yield current, False
        current = following
    yield current, True


def _mean_loss(losses: np.ndarray, nan_inf_filter: bool) -> float:
    """The mean per-sample loss; with ``logging_nan_inf_filter`` the non-finite losses are left out (as upstream)."""
    if nan_inf_filter:
        finite = np.isfinite(losses)
        if finite.any():
            losses = losses[finite]
    return float(np.mean(losses)) if losses.size else float("nan")


def _outputs_as_mapping(outputs: Any) -> Any:
    """A model output that is neither a tensor, a tuple/list nor a mapping, seen as a dict of its fields."""
    if outputs is None or isinstance(outputs, (torch.Tensor, tuple, list, Mapping)):
        return outputs
    import dataclasses

    if dataclasses.is_dataclass(outputs):
        return {f.name: getattr(outputs, f.name) for f in dataclasses.fields(outputs)}
    if hasattr(outputs, "__dict__"):
        return {key: value for key, value in vars(outputs).items() if not key.startswith("_")}
    return outputs


def _split_logits(outputs: Any, ignore_keys: list[str], *, has_loss: bool) -> Any:
    """The prediction part of a model output: mapping values not ignored, or a tuple without its loss."""
    outputs = _outputs_as_mapping(outputs)
    if isinstance(outputs, Mapping):
        skip = set(ignore_keys) | ({"loss"} if has_loss else set())
        return tuple(value for key, value in outputs.items() if key not in skip and value is not None)
    if isinstance(outputs, (tuple, list)):
        return tuple(outputs[1:]) if has_loss else tuple(outputs)
    return outputs  # a single tensor


# --------------------------------------------------------------------------------------------------------------
# evaluate / predict and their dataloaders
# --------------------------------------------------------------------------------------------------------------


class _ScheduleFree(Protocol):
    """A schedule-free optimizer's modes (torch's ``Optimizer`` has neither method)."""

    def train(self) -> Any: ...

    def eval(self) -> Any: ...


def _schedule_free_mode(optimizer: Any) -> bool:
    """True for a schedule-free optimizer in train mode (one with ``train()``/``eval()`` and a ``train_mode``)."""
    groups: Any = getattr(optimizer, "param_groups", None)
    return bool(groups) and callable(getattr(optimizer, "eval", None)) and groups[0].get("train_mode", False)


def eval_dataloader(trainer: EvalLoopTrainer, eval_dataset: Any = None) -> DataLoader:
    """The evaluation DataLoader (sequential); ``eval_dataset`` may be a dataset or the name of one of a dict."""
    if eval_dataset is None and trainer.eval_dataset is None:
        raise ValueError("Trainer: evaluation requires an eval_dataset; pass Trainer(eval_dataset=...) "
                         "or trainer.evaluate(eval_dataset=...).")
    key = eval_dataset if isinstance(eval_dataset, str) else "eval"  # upstream's dataloader_key
    if isinstance(eval_dataset, str):
        if not isinstance(trainer.eval_dataset, Mapping) or eval_dataset not in trainer.eval_dataset:
            names = list(trainer.eval_dataset) if isinstance(trainer.eval_dataset, Mapping) else []
            raise KeyError(f"eval_dataset={eval_dataset!r} is not a name of Trainer.eval_dataset "
                           f"(names: {names}); pass a dataset or one of those names.")
        eval_dataset = trainer.eval_dataset[eval_dataset]
    elif eval_dataset is None:
        eval_dataset = trainer.eval_dataset
    if isinstance(eval_dataset, Mapping):
        raise ValueError(f"get_eval_dataloader got a dict of datasets (names: {list(eval_dataset)}); "
                         "pass one dataset or one of those names (evaluate() handles dicts itself).")
    kept = persistent_eval_loader(trainer, key, eval_dataset)
    if kept is not None:
        return kept
    return trainer._get_dataloader(eval_dataset, "Evaluation", trainer.args.eval_batch_size,
                                   sampler_fn=trainer._get_eval_sampler, dataloader_key=key)


def persistent_eval_loader(trainer: EvalLoopTrainer, key: str, dataset: Any) -> DataLoader | None:
    """The loader built earlier for ``key`` over this same ``dataset``, under ``dataloader_persistent_workers``: one
    loader per evaluation set, so its workers persist across evaluations (as upstream's ``_eval_dataloaders``). A
    different dataset under the same key (``evaluate(other_dataset)``) gets a new loader, where upstream's returns
    the first one."""
    if not trainer.args.dataloader_persistent_workers:
        return None
    kept = getattr(trainer, "_eval_dataloaders", {}).get(key)
    return kept if kept is not None and getattr(kept, "_tw_source_dataset", None) is dataset else None


def prediction_dataloader(trainer: EvalLoopTrainer, test_dataset: Any) -> DataLoader:
    """The prediction DataLoader for ``test_dataset`` (sequential)."""
    if test_dataset is None:
        raise ValueError("Trainer.predict requires a test_dataset; pass trainer.predict(test_dataset).")
    return trainer._get_dataloader(test_dataset, "test", trainer.args.eval_batch_size,
                                   sampler_fn=trainer._get_eval_sampler)


def run_evaluate(trainer: EvalLoopTrainer, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
    """``Trainer.evaluate``: the metrics (loss, compute_metrics results, speed; the epoch that ``log`` adds), all prefixed.

    A dict of datasets (passed here or given to the Trainer) evaluates each one (through ``trainer.evaluate``)
    with the prefix ``f"{metric_key_prefix}_{name}"`` and returns the merged metrics.
    """
    override = eval_dataset is not None
    datasets = eval_dataset if override else trainer.eval_dataset
    if isinstance(datasets, Mapping):
        metrics: dict[str, float] = {}
        for name, dataset in datasets.items():
            metrics.update(trainer.evaluate(eval_dataset=dataset if override else name, ignore_keys=ignore_keys,
                                            metric_key_prefix=f"{metric_key_prefix}_{name}"))
        return metrics
    output = _measured_loop(trainer, "eval", lambda: trainer.get_eval_dataloader(eval_dataset), "Evaluation",
                            prediction_loss_only=True if trainer.compute_metrics is None else None,
                            ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
    metrics = output.metrics
    trainer.log(metrics)  # adds the epoch to metrics, as upstream's (a log() override that copies them keeps it out)
    trainer.control = trainer.callback_handler.on_evaluate(trainer.args, trainer.state, trainer.control,
                                                           metrics=metrics)
    trainer._memory_tracker.stop_and_update_metrics(metrics, stage="eval")
    return metrics


def run_predict(trainer: EvalLoopTrainer, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
    """``Trainer.predict``: predictions (padded with -100 when lengths differ), label ids and metrics."""
    output = _measured_loop(trainer, "test", lambda: trainer.get_test_dataloader(test_dataset), "Prediction",
                            ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
    trainer.control = trainer.callback_handler.on_predict(trainer.args, trainer.state, trainer.control,
                                                          metrics=output.metrics)
    trainer._memory_tracker.stop_and_update_metrics(output.metrics, stage="test")
    return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics)


def _measured_loop(trainer: EvalLoopTrainer, stage: str, dataloader: Callable[[], Any], description: str, *,
                   metric_key_prefix: str, **loop_kwargs: Any) -> Any:
    """What the trainer's evaluation loop (an override's: upstream's ``EvalLoopOutput`` shape) returns over the
    DataLoader ``dataloader()`` builds, measured as the memory tracker's ``stage`` (``"eval"`` or ``"test"``), its
    speed added to the output's metrics. The caller stops the stage once its callbacks ran; on an error it is stopped
    here, so that a later train/evaluate is tracked again."""
    trainer._memory_tracker.start(stage)
    try:
        loader = dataloader()
        start_time = time.time()
        output = _loop_method(trainer)(loader, description=description, metric_key_prefix=metric_key_prefix,
                                       **loop_kwargs)
    except BaseException:
        trainer._memory_tracker.stop(stage)
        raise
    output.metrics.update(_loop_speed(trainer, metric_key_prefix, start_time, output.num_samples))
    return output


def _loop_speed(trainer: EvalLoopTrainer, prefix: str, start_time: float, num_samples: int) -> dict[str, float]:
    total_batch_size = trainer.args.eval_batch_size * trainer.args.world_size
    return speed_metrics(prefix, start_time, num_samples=num_samples,
                         num_steps=math.ceil(num_samples / max(1, total_batch_size)))


def _loop_method(trainer: EvalLoopTrainer) -> Any:
    """``prediction_loop`` with ``use_legacy_prediction_loop``, else ``evaluation_loop`` (as upstream picks)."""
    return trainer.prediction_loop if trainer.args.use_legacy_prediction_loop else trainer.evaluation_loop


# --------------------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------------------


def run_evaluation(trainer: EvalLoopTrainer, dataloader: Any, description: str,
                   prediction_loss_only: bool | None = None, ignore_keys: list[str] | None = None,
                   metric_key_prefix: str = "eval", *, model: Any) -> EvalLoopOutput:
    """The loop shared by ``evaluate`` and ``predict`` (``Trainer.evaluation_loop``); with or without labels.

    Returns numpy predictions / label ids (nested like the model's outputs), prefixed metrics and the
    number of samples (``len(dataset)``, or the count seen while iterating a dataset without ``__len__``).
    ``model`` is what to run inference with (the Trainer's model, placed and cast for evaluation).
    """
    args = trainer.args
    if prediction_loss_only is None:
        prediction_loss_only = args.prediction_loss_only
    model.eval()
    # a schedule-free optimizer evaluates its averaged weights (optimizer.eval(), as upstream), then goes back
    optimizer_in_train_mode = _schedule_free_mode(trainer.optimizer)
    if optimizer_in_train_mode:
        cast("_ScheduleFree", trainer.optimizer).eval()
    trainer.callback_handler.eval_dataloader = dataloader
    if args.past_index >= 0:
        trainer._past = None
    # the forward in mixed precision wherever a library calls it (its own prediction_step), as accelerate prepares it
    from .train_hooks import forward_precision, upcasts_outputs  # here: importing the Trainer stays lean

    precision = forward_precision(unwrap_model(model), trainer.backend.autocast) \
        if upcasts_outputs(args) and isinstance(model, torch.nn.Module) else None
    try:
        accumulators, batch_metrics, observed = _eval_batches(
            trainer, model, dataloader, description, prediction_loss_only, ignore_keys)
    finally:
        if precision is not None:
            precision.remove()
        if args.past_index >= 0:
            trainer._past = None  # not carried into training (upstream deletes it; None keeps the attribute)
        if optimizer_in_train_mode:
            cast("_ScheduleFree", trainer.optimizer).train()
    num_samples = _num_eval_samples(trainer, dataloader, observed)
    losses, preds, labels, inputs = (acc.result() for acc in accumulators)
    metrics = _eval_metrics(trainer, preds, labels, losses, inputs, batch_metrics)
    if trainer.compute_metrics is not None and not prediction_loss_only and not args.batch_eval_metrics:
        _warn_if_metrics_skipped(trainer, preds, labels, description)
    if losses is not None:
        metrics[f"{metric_key_prefix}_loss"] = _mean_loss(losses, args.logging_nan_inf_filter)
    metrics = _prefix_keys(metrics, metric_key_prefix)
    return EvalLoopOutput(predictions=preds, label_ids=labels, metrics=metrics, num_samples=num_samples)


def _eval_batches(trainer: EvalLoopTrainer, model: Any, dataloader: Any, description: str,
                  prediction_loss_only: bool, ignore_keys: list[str] | None
                  ) -> tuple[list[OutputAccumulator], Any, int]:
    """Iterate the dataloader: predict, gather across ranks, accumulate; returns accumulators and counts.

    Under several processes each rank's outputs are gathered as separate parts (in rank order) and handled
    as the batches one process would have seen. A sampler that tells how many of its batches are real
    (``num_real_batches``, :class:`~trainwell.data.samplers.EvalShardSampler`) has the placeholder batches after
    them dropped before the gather, so they count in no loss, prediction or metric. Batches are kept or dropped
    whole, never cut by counting rows: a collator may put several rows per sample (TRL's preference collators put
    a pair's chosen and rejected sequences in one batch of twice the samples).
    """
    args = trainer.args
    concat = args.eval_do_concat_batches
    accumulators = [OutputAccumulator(concat=c) for c in (True, concat, concat, concat)]
    keep_outputs = not args.batch_eval_metrics or description == "Prediction"
    include = args.include_for_metrics or []
    batch_metrics_on = args.batch_eval_metrics and trainer.compute_metrics is not None
    accumulation_steps = args.eval_accumulation_steps
    real_batches = getattr(getattr(dataloader, "sampler", None), "num_real_batches", None)
    batches: Iterable[tuple[Any, int | None]] = ((batch, None) for batch in dataloader)
    if _is_dist() and isinstance(getattr(dataloader, "dataset", None), torch.utils.data.IterableDataset):
        import torch.distributed as dist

        batches = _round_robin(dataloader, dist.get_rank(), dist.get_world_size())
    distributed = _is_dist()
    remainder = RemainderCut(dataloader) if real_batches is None and distributed else None
    batch_metrics, observed, steps = None, 0, 0
    for step, ((batch, placeholder), is_last) in enumerate(_mark_last(batches)):
        steps += 1
        # rows no tensor tells (TRL's GRPO batches: lists of prompt dicts): the loss counts eval_batch_size times,
        # as upstream's evaluation_loop repeats it
        batch_size = (told := find_batch_size(batch)) or args.eval_batch_size
        if real_batches is not None and step >= real_batches:
            placeholder = 0
        real = batch_size if placeholder is None else placeholder  # the rows kept: all of the batch, or none
        observed += real or 0
        if told is None and is_last and not distributed and placeholder is None:
            real = _untold_last_rows(dataloader, batch_size)
        # a library gathering its own metrics meanwhile (TRL's) leaves a placeholder batch out too
        with predicting_batch(placeholder == 0) if distributed else nullcontext():
            parts = _batch_parts(trainer, model, batch, batch_size, real, prediction_loss_only, ignore_keys)
        if remainder is not None:
            parts = remainder.cut(parts, is_last)
        for i, (part_loss, part_logits, part_label, part_inputs) in enumerate(parts):
            _add_part(accumulators, (part_loss, part_logits, part_label, part_inputs), keep_outputs)
            if batch_metrics_on and part_logits is not None and part_label is not None:
                eval_pred = EvalPrediction(predictions=part_logits, label_ids=part_label,
                                           inputs=part_inputs if "inputs" in include else None,
                                           losses=part_loss if "loss" in include else None)
                batch_metrics = _call_compute_metrics(trainer, eval_pred,
                                                      compute_result=is_last and i == len(parts) - 1)
        trainer.control = trainer.callback_handler.on_prediction_step(args, trainer.state, trainer.control)
        if accumulation_steps and (step + 1) % accumulation_steps == 0:
            for accumulator in accumulators:
                accumulator.flush()
    if steps == 0:
        raise ValueError(no_batches_message(dataloader, description))
    return accumulators, batch_metrics, observed


def no_batches_message(dataloader: Any, description: str) -> str:
    """Why an evaluation loader yielded nothing, and what to change: an empty dataset, or (on several processes) a
    batch sampler that drops its last incomplete round (``dataloader_drop_last``, which sentence-transformers sets
    on several processes), where the rows do not make one batch for every process."""
    what = f"The {description.lower()} dataset yielded no batches"
    holder: Any = dataloader.sampler if isinstance(getattr(dataloader, "sampler", None), torch.utils.data.BatchSampler) \
        else getattr(dataloader, "batch_sampler", None)
    processes = getattr(holder, "num_processes", 1)
    try:
        rows = len(dataloader.dataset)
    except (AttributeError, TypeError):
        rows = 0
    if processes > 1 and rows and getattr(holder, "drop_last", False):
        size = getattr(holder, "batch_size", None)
        return (f"{what} on this process: its {rows} rows in batches of {size} do not make one full batch for each "
                f"of the {processes} processes, and the batch sampler drops the last incomplete round "
                "(dataloader_drop_last=True, which sentence-transformers sets on several processes). Use a smaller "
                "per_device_eval_batch_size, more evaluation rows, or fewer processes.")
    return f"{what}; pass a non-empty dataset (an IterableDataset must yield at least one example)."


def _untold_last_rows(dataloader: Any, batch_size: int) -> int:
    """How many times the last batch's loss counts when no tensor tells its rows (TRL's GRPO/RLOO: lists of prompt
    dicts, the loss counted ``eval_batch_size`` times), as upstream's one process counts it: accelerate's
    ``gather_for_metrics`` keeps the first ``len(dataset) % batch_size`` of them. GRPO's sampler yields each prompt
    ``num_generations`` times, so 6 prompts in batches of 4 give 3 full batches, the last one weighed 2 of 4."""
    try:
        length = len(dataloader.dataset)
    except (AttributeError, TypeError):
        return batch_size
    if getattr(dataloader, "drop_last", False) or isinstance(dataloader.dataset, torch.utils.data.IterableDataset):
        return batch_size
    return length % batch_size or batch_size


def _batch_parts(trainer: EvalLoopTrainer, model: Any, batch: Any, batch_size: int | None, real: int | None,
                 prediction_loss_only: bool, ignore_keys: list[str] | None) -> list[tuple[Any, Any, Any, Any]]:
    """One batch's ``(loss, logits, labels, inputs)`` as one part per rank (one part outside a process group).

    Calls ``trainer.prediction_step`` (an override is honoured), then ``preprocess_logits_for_metrics``; only the
    ``real`` rows are kept, so placeholder rows reach no rank's part.
    """
    loss, logits, label = trainer.prediction_step(model, batch, prediction_loss_only, ignore_keys=ignore_keys)
    batch_inputs = _inputs_for_metrics(trainer, batch) if "inputs" in (trainer.args.include_for_metrics or []) \
        else None
    loss = _per_sample_loss(loss, batch_size, real)
    if logits is not None and trainer.preprocess_logits_for_metrics is not None:
        logits = trainer.preprocess_logits_for_metrics(logits, label)
    outputs = (loss, *keep_rows((logits, label, batch_inputs), batch_size, real))
    if not _is_dist():
        return [outputs]
    count = torch.tensor([real if real is not None else 1], device=_device_of(outputs))
    gathered = gather_parts((count, *outputs), bool(trainer.args.eval_use_gather_object))
    return [part[1:] for part in gathered if int(part[0][0]) > 0]


def _add_part(accumulators: list[OutputAccumulator], part: tuple[Any, Any, Any, Any], keep_outputs: bool) -> None:
    """Keep one batch's (one rank's) loss, and its predictions/labels/inputs unless only metrics are kept."""
    losses, preds, labels, inputs = accumulators
    losses.add(part[0])
    if keep_outputs:
        preds.add(part[1])
        labels.add(part[2])
        inputs.add(part[3])


def _per_sample_loss(loss: Any, batch_size: int | None, real: int | None = None) -> Any:
    """The batch loss once per real sample, so that the mean over samples weighs batches by their real size.

    ``real`` (default: ``batch_size``) is how many of the batch's samples are real; a placeholder batch
    (``real == 0``) contributes nothing. A per-sample loss vector keeps its first ``real`` entries.
    """
    if loss is None:
        return None
    real = batch_size if real is None else real
    loss = torch.as_tensor(loss).detach().reshape(-1)
    if loss.numel() == 1 and batch_size:
        return loss.repeat(real)
    if batch_size and loss.numel() == batch_size:
        return loss[:real]
    return loss


def _inputs_for_metrics(trainer: EvalLoopTrainer, batch: Mapping[str, Any]) -> Any:
    """The model's main input of a batch (``include_for_metrics=["inputs"]``), on the device."""
    name = getattr(trainer.model, "main_input_name", "input_ids")
    if not isinstance(batch, Mapping) or name not in batch:
        keys = list(batch) if isinstance(batch, Mapping) else type(batch).__name__
        raise ValueError(f"include_for_metrics contains 'inputs' but the batch has no {name!r} entry (the "
                         f"model's main_input_name); batch keys: {keys}. Set model.main_input_name to the "
                         "input to keep, or remove 'inputs' from include_for_metrics.")
    return trainer._prepare_inputs({name: batch[name]})[name]


def _num_eval_samples(trainer: EvalLoopTrainer, dataloader: Any, observed: int) -> int:
    """``len(dataset)`` when the dataset has a length, else the examples counted on every rank."""
    dataset = getattr(dataloader, "dataset", None)
    try:
        num_samples = len(dataset) if dataset is not None else None
    except TypeError:
        num_samples = None
    if num_samples:
        return num_samples
    model = trainer.model
    device = next((p.device for p in model.parameters()), torch.device("cpu")) \
        if hasattr(model, "parameters") else torch.device("cpu")
    return _sum_across_ranks(observed, device)


def _eval_metrics(trainer: EvalLoopTrainer, preds: Any, labels: Any, losses: Any, inputs: Any,
                  batch_metrics: Any) -> dict[str, Any]:
    """compute_metrics on the gathered arrays (or the last batch_eval_metrics result), as python numbers."""
    include = trainer.args.include_for_metrics or []
    if trainer.args.batch_eval_metrics:
        metrics = batch_metrics
    elif trainer.compute_metrics is not None and preds is not None and labels is not None:
        eval_pred = EvalPrediction(predictions=preds, label_ids=labels,
                                   inputs=inputs if "inputs" in include else None,
                                   losses=losses if "loss" in include else None)
        metrics = _call_compute_metrics(trainer, eval_pred)
    else:
        metrics = None
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"compute_metrics ({_function_name(trainer.compute_metrics)}) returned "
                        f"{type(metrics).__name__}; it must return a dict of metric name -> value.")
    return dict(denumpify_detensorize(dict(metrics)))


def _call_compute_metrics(trainer: EvalLoopTrainer, eval_pred: EvalPrediction, **kwargs: Any) -> Any:
    """Call compute_metrics; an error is re-raised naming the function and the shapes it was given."""
    compute_metrics = trainer.compute_metrics
    assert compute_metrics is not None  # the callers checked
    try:
        return compute_metrics(eval_pred, **kwargs)
    except Exception as err:
        raise RuntimeError(
            f"compute_metrics ({_function_name(compute_metrics)}) failed on predictions of shape "
            f"{_shape_of(eval_pred.predictions)} and label_ids of shape {_shape_of(eval_pred.label_ids)}: "
            f"{type(err).__name__}: {err}") from err


def prediction_step(trainer: EvalLoopTrainer, model: Any, inputs: dict[str, Any], prediction_loss_only: bool,
                    ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
    """One evaluation step (``Trainer.prediction_step``): ``(loss, logits, labels)``, each optional.

    Labels are taken from ``label_names`` before the forward pass; with labels (or a model that returns its
    loss without labels) the loss comes from ``trainer.compute_loss``. ``ignore_keys`` (default: the model
    config's ``keys_to_ignore_at_inference``) drops entries of a dict output; a tuple output's first element is
    the loss when there is one. One remaining output is returned as itself, several as a tuple.
    """
    label_names = list(trainer.label_names or [])
    has_labels = bool(label_names) and all(inputs.get(name) is not None for name in label_names)
    return_loss = inputs.get("return_loss", None)
    if return_loss is None:
        return_loss = trainer.can_return_loss
    loss_without_labels = not label_names and bool(return_loss)
    inputs = trainer._prepare_inputs(inputs)
    if ignore_keys is None:
        config = getattr(trainer.model, "config", None)
        ignore_keys = [] if config is None else list(
            getattr(config, "keys_to_ignore_at_inference", ["past_key_values"]) or [])
    labels = None
    if has_labels or loss_without_labels:
        labels = nested_detach(tuple(inputs.get(name) for name in label_names))
        # a loss without labels (label_names=[], can_return_loss) leaves an empty tuple, as upstream: compute_metrics
        # still runs on the predictions (TRL's RewardTrainer)
        labels = labels[0] if len(labels) == 1 else labels
    with torch.no_grad(), trainer.backend.autocast(), _float32_outputs(trainer, model):
        if has_labels or loss_without_labels:
            # an override with upstream's pre-4.46 signature compute_loss(model, inputs, return_outputs=False) works too
            loss, outputs = call_override(trainer, "compute_loss", model, inputs, return_outputs=True,
                                          num_items_in_batch=None)
            loss = loss.detach().mean()
        else:
            loss, outputs = None, model(**inputs)
            if trainer.args.past_index >= 0:
                trainer._past = _past_from(outputs, trainer.args.past_index - 1)
    if prediction_loss_only:
        return loss, None, None
    logits = nested_detach(_split_logits(outputs, ignore_keys, has_loss=loss is not None))
    if isinstance(logits, tuple) and len(logits) == 1:
        logits = logits[0]
    elif isinstance(logits, tuple) and not logits:
        logits = None
    return loss, logits, labels


@contextmanager
def _float32_outputs(trainer: EvalLoopTrainer, model: Any) -> Iterator[None]:
    """Under mixed precision (``fp16``/``bf16``, not DeepSpeed's own), ``model``'s forward returns float32 outputs.

    Upstream's accelerate wraps the prepared model's forward in ``convert_outputs_to_fp32``, so the loss hooks
    (``compute_loss_func``, label smoothing), ``preprocess_logits_for_metrics`` and ``compute_metrics`` see float32
    logits although the forward ran in autocast; a forward hook does the same for the span of one prediction step.
    """
    args = trainer.args
    if not (getattr(args, "fp16", False) or getattr(args, "bf16", False)) or getattr(args, "deepspeed", None) \
            or not isinstance(model, torch.nn.Module):
        yield
        return
    handle = model.register_forward_hook(lambda _module, _args, output: upcast_half(output))
    try:
        yield
    finally:
        handle.remove()


def _past_from(outputs: Any, index: int) -> Any:
    """The memory/past state at ``index`` of a model's outputs (``args.past_index``)."""
    outputs = _outputs_as_mapping(outputs)
    values = list(outputs.values()) if isinstance(outputs, Mapping) else outputs
    return values[index] if isinstance(values, (list, tuple)) and -len(values) <= index < len(values) else None


# The reasons each trainer was already warned of (weak keys: a trainer's entry goes with it).
_METRICS_SKIP_WARNED: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _warn_if_metrics_skipped(trainer: EvalLoopTrainer, preds: Any, labels: Any, description: str) -> None:
    """Warn once per reason when ``compute_metrics`` was given but could not run (upstream skips it silently)."""
    if preds is None:
        reason = ("the model returned no logits (only a loss): return them from forward (a tuple (loss, logits) or "
                  "a dict with 'logits'), and check `ignore_keys`")
    elif labels is None and description != "Prediction":  # predicting on unlabelled data is the normal case
        reason = (f"the evaluation batches have no labels (looked for {trainer.label_names}): add a 'labels' column "
                  "or set `label_names` in TrainingArguments")
    else:
        return
    warned = _METRICS_SKIP_WARNED.setdefault(trainer, set())
    if reason not in warned:
        warned.add(reason)
        warnings.warn(f"compute_metrics was not called: {reason}.", UserWarning, stacklevel=4)
