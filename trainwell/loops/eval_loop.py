"""Evaluation and prediction: the loop behind ``Trainer.evaluate`` / ``Trainer.predict``, gathering and metrics.

The gathering path scales linearly with the number of batches: each batch's outputs are kept as a separate
piece (CPU tensors are turned into numpy at once; accelerator tensors every ``eval_accumulation_steps`` steps
or at the end), and every output is padded and concatenated exactly once, at the end, into one preallocated
array. Pieces are released while the final array is filled, so the peak memory stays close to the size of
the result. Outputs whose sequence lengths differ between batches are padded on the right with ``-100``
(trailing dimensions, dim 1 being the sequence dimension).

:class:`EvaluationMixin` is what :class:`trainwell.Trainer` inherits; it relies only on the attributes listed
in its docstring.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from ..utils.overrides import call_override
from ..utils.reporting import speed_metrics
from ..utils.trainer_utils import EvalLoopOutput, EvalPrediction, PredictionOutput
from .gather import (_device_of, _is_dist, _round_robin, _sum_across_ranks, gather_across_ranks,  # noqa: F401
                     gather_parts, keep_rows)
from .nested import _flatten, _unflatten, nested_detach, nested_map  # noqa: F401

PAD_INDEX = -100

def _leaf_to_numpy(leaf: Any) -> Any:
    """One output leaf as a CPU numpy array (bfloat16 and other types numpy lacks become float32)."""
    if leaf is None:
        return None
    if not isinstance(leaf, torch.Tensor):
        return np.asarray(leaf)
    tensor = leaf.detach()
    if tensor.dtype == torch.bfloat16 or (tensor.is_floating_point() and tensor.element_size() == 1):
        tensor = tensor.float()  # numpy has no bfloat16 / float8
    if tensor.device.type == "cpu":
        # Copy: a model may return views of a buffer it reuses, and a copy keeps only the slice alive.
        return tensor.numpy().copy()
    return tensor.cpu().numpy()


def nested_numpify(obj: Any) -> Any:
    """A nested structure of tensors as the same structure of CPU numpy arrays."""
    return nested_map(_leaf_to_numpy, obj)


def find_batch_size(inputs: Any) -> int | None:
    """The size of the first dimension of the first tensor found in a (nested) batch, or None."""
    leaves, _ = _flatten(inputs)
    for leaf in leaves:
        if isinstance(leaf, (torch.Tensor, np.ndarray)) and leaf.ndim > 0:
            return int(leaf.shape[0])
    return None


def _shape_of(obj: Any) -> Any:
    """The shapes of a nested output, for error messages."""
    if obj is None:
        return None
    if isinstance(obj, list) and obj and not hasattr(obj[0], "shape"):
        return f"list of {len(obj)} batches"
    return nested_map(lambda x: tuple(x.shape) if hasattr(x, "shape") else type(x).__name__, obj)


# --------------------------------------------------------------------------------------------------------------
# Padding and concatenation, done once
# --------------------------------------------------------------------------------------------------------------


def pad_and_concatenate(pieces: list[Any], pad_index: int = PAD_INDEX, limit: int | None = None) -> np.ndarray | None:
    """Concatenate numpy arrays along dim 0, padding the trailing dims on the right with ``pad_index``.

    The result is allocated once; ``pieces`` is consumed (its entries are set to None as they are copied, so
    their memory can be released while the result fills up). ``limit`` keeps only the first rows.
    """
    if all(piece is None for piece in pieces):
        return None
    if any(piece is None for piece in pieces):
        raise ValueError("An output is None for some batches and not for others; it cannot be concatenated. "
                         "Make the model return the same outputs for every batch (or list it in ignore_keys).")
    pieces[:] = [np.atleast_1d(piece) for piece in pieces]
    ndims = {piece.ndim for piece in pieces}
    if len(ndims) != 1:
        raise ValueError(f"Cannot concatenate outputs with different numbers of dimensions {sorted(ndims)}; "
                         "make every batch return tensors of the same rank.")
    trailing = tuple(max(piece.shape[d] for piece in pieces) for d in range(1, pieces[0].ndim))
    ragged = any(piece.shape[1:] != trailing for piece in pieces)
    dtype = np.result_type(*(piece.dtype for piece in pieces))
    if ragged and dtype.kind in "bu":
        dtype = np.dtype(np.int64)  # -100 must be representable
    rows = sum(piece.shape[0] for piece in pieces)
    rows = rows if limit is None else min(rows, limit)
    # np.empty leaves pages untouched until written, so the result's memory grows as the pieces are freed.
    out = np.empty((rows,) + trailing, dtype=dtype)
    offset = 0
    for i in range(len(pieces)):
        piece, pieces[i] = pieces[i], None
        count = min(piece.shape[0], rows - offset)
        if count <= 0:
            continue
        target = out[offset:offset + count]
        if piece.shape[1:] != trailing:
            target.fill(pad_index)
            target = target[(slice(None),) + tuple(slice(0, size) for size in piece.shape[1:])]
        target[...] = piece[:count]
        offset += count
    return out


def _truncate_batches(batches: list[Any], limit: int | None) -> list[Any]:
    """Keep the first ``limit`` rows of a list of per-batch nested arrays (eval_do_concat_batches=False)."""
    if limit is None:
        return batches
    kept, seen = [], 0
    for batch in batches:
        size = find_batch_size(batch)
        if size is None or seen + size <= limit:
            kept.append(batch)
            seen += size or 0
            continue
        if limit > seen:
            keep = limit - seen
            kept.append(nested_map(lambda x: x[:keep] if getattr(x, "ndim", 0) > 0 else x, batch))
        break
    return kept


_SLAB_MIN, _SLAB_MAX = 2**20, 64 * 2**20


class _SlabStore:
    """Append-only copies of one output leaf, packed into anonymous memory maps (slabs).

    Per-batch copies made with ``malloc`` land on the heap, whose freed memory is rarely returned to the OS;
    a slab is its own mapping, unmapped as soon as the last view into it is dropped. So while the final array
    fills up and the pieces are dropped in order, the process does not hold both in full. Slabs grow with the
    data (1/8 of what is stored so far, 1 to 64 MiB), which bounds both the waste and the number of mappings.
    """

    def __init__(self) -> None:
        self._slab: np.ndarray | None = None
        self._used = 0
        self._stored = 0

    def _new_slab(self, nbytes: int) -> None:
        import mmap

        size = max(nbytes, min(_SLAB_MAX, max(_SLAB_MIN, self._stored // 8)))
        size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
        self._slab, self._used = np.frombuffer(mmap.mmap(-1, size), dtype=np.uint8), 0

    def _reserve(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if self._slab is None or self._used + nbytes > self._slab.nbytes:
            self._new_slab(nbytes)
        view = self._slab[self._used:self._used + nbytes].view(dtype).reshape(shape)
        self._used += -(-nbytes // 64) * 64  # keep every piece 64-byte aligned
        self._stored += nbytes
        return view

    def copy_in(self, leaf: Any) -> Any:
        """A numpy copy of ``leaf`` (a tensor on any device, or an array) living in the current slab."""
        if isinstance(leaf, torch.Tensor):
            tensor = leaf.detach()
            if tensor.dtype == torch.bfloat16 or (tensor.is_floating_point() and tensor.element_size() == 1):
                tensor = tensor.float()  # numpy has no bfloat16 / float8
            view = self._reserve(_numpy_dtype(tensor.dtype), tuple(tensor.shape))
            torch.from_numpy(view).copy_(tensor)  # one device-to-host copy, straight into the slab
            return view
        source = np.asarray(leaf)
        if source.dtype == object:
            return source.copy()
        view = self._reserve(source.dtype, source.shape)
        view[...] = source
        return view


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return torch.empty((), dtype=dtype).numpy().dtype


class OutputAccumulator:
    """Collects one kind of output (losses, predictions, labels or inputs) over the batches of a loop.

    ``add`` keeps each batch's nested tensors as a piece (CPU ones are copied to numpy at once, accelerator ones
    stay on the device until ``flush``); ``result`` pads and concatenates every leaf once, or returns the list
    of per-batch structures when ``concat`` is False.
    """

    def __init__(self, concat: bool = True, pad_index: int = PAD_INDEX) -> None:
        self.concat = concat
        self.pad_index = pad_index
        self._device: list[Any] = []
        self._host: list[Any] = []
        self._stores: list[_SlabStore] = []

    def add(self, nested: Any) -> None:
        """Keep one batch's output (None is ignored)."""
        if nested is None:
            return
        leaves, spec = _flatten(nested)
        if all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in leaves):
            self._host.append(self._to_host(leaves, spec))
        else:
            self._device.append(nested_detach(nested))

    def _to_host(self, leaves: list[Any], spec: Any) -> Any:
        if not self.concat:
            return _unflatten(spec, [_leaf_to_numpy(leaf) for leaf in leaves])
        while len(self._stores) < len(leaves):
            self._stores.append(_SlabStore())
        return _unflatten(spec, [None if leaf is None else store.copy_in(leaf)
                                 for store, leaf in zip(self._stores, leaves)])

    def flush(self) -> None:
        """Move the pieces still on the accelerator to CPU numpy arrays."""
        device, self._device = self._device, []
        for i in range(len(device)):
            piece, device[i] = device[i], None  # release each device piece as soon as it is copied
            self._host.append(self._to_host(*_flatten(piece)))

    def result(self, limit: int | None = None) -> Any:
        """All pieces as one nested structure of numpy arrays (or a list of batches); None when nothing was added."""
        self.flush()
        pieces, self._host, self._stores = self._host, [], []
        if not pieces:
            return None
        if not self.concat:
            return _truncate_batches(pieces, limit)
        _, spec = _flatten(pieces[0])
        columns: list[list[Any]] = []
        for i in range(len(pieces)):
            (leaves, piece_spec), pieces[i] = _flatten(pieces[i]), None
            if piece_spec != spec:
                raise ValueError("The model's outputs changed structure between batches; every batch must return "
                                 "the same tuple/dict layout to be concatenated (or set eval_do_concat_batches=False).")
            if not columns:
                columns = [[] for _ in leaves]
            for column, leaf in zip(columns, leaves):
                column.append(leaf)
        return _unflatten(spec, [pad_and_concatenate(column, self.pad_index, limit) for column in columns])


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
    return {key if key.startswith(f"{prefix}_") else f"{prefix}_{key}": value for key, value in metrics.items()}


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
# The mixin
# --------------------------------------------------------------------------------------------------------------


def _schedule_free_mode(optimizer: Any) -> bool:
    """True for a schedule-free optimizer in train mode (one with ``train()``/``eval()`` and a ``train_mode``)."""
    groups = getattr(optimizer, "param_groups", None)
    return bool(groups) and callable(getattr(optimizer, "eval", None)) and groups[0].get("train_mode", False)


class EvaluationMixin:
    """``evaluate``, ``predict``, ``evaluation_loop``, ``prediction_step`` and the eval/test dataloaders.

    Relies only on these attributes of the class it is mixed into: ``args``, ``model``, ``state``, ``control``,
    ``callback_handler``, ``compute_metrics``, ``preprocess_logits_for_metrics``, ``eval_dataset``,
    ``label_names``, ``can_return_loss``, ``_memory_tracker``, ``log(logs)``, ``_prepare_inputs(inputs)``,
    ``compute_loss(model, inputs, return_outputs, num_items_in_batch)``,
    ``_build_dataloader(dataset, *, batch_size, train, description)``, ``_model_for_eval()`` and
    ``backend.autocast()``.
    """

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """The evaluation DataLoader (sequential); ``eval_dataset`` may be a dataset or the name of one of a dict."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset; pass Trainer(eval_dataset=...) "
                             "or trainer.evaluate(eval_dataset=...).")
        if isinstance(eval_dataset, str):
            if not isinstance(self.eval_dataset, Mapping) or eval_dataset not in self.eval_dataset:
                names = list(self.eval_dataset) if isinstance(self.eval_dataset, Mapping) else []
                raise KeyError(f"eval_dataset={eval_dataset!r} is not a name of Trainer.eval_dataset "
                               f"(names: {names}); pass a dataset or one of those names.")
            eval_dataset = self.eval_dataset[eval_dataset]
        elif eval_dataset is None:
            eval_dataset = self.eval_dataset
        if isinstance(eval_dataset, Mapping):
            raise ValueError(f"get_eval_dataloader got a dict of datasets (names: {list(eval_dataset)}); "
                             "pass one dataset or one of those names (evaluate() handles dicts itself).")
        return self._build_dataloader(eval_dataset, batch_size=self.args.eval_batch_size, train=False,
                                      description="eval_dataset")

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """The prediction DataLoader for ``test_dataset`` (sequential)."""
        if test_dataset is None:
            raise ValueError("Trainer.predict requires a test_dataset; pass trainer.predict(test_dataset).")
        return self._build_dataloader(test_dataset, batch_size=self.args.eval_batch_size, train=False,
                                      description="test_dataset")

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]:
        """Run evaluation and return the metrics (loss, compute_metrics results, speed, epoch), all prefixed.

        A dict of datasets (passed here or given to the Trainer) evaluates each one with the prefix
        ``f"{metric_key_prefix}_{name}"`` and returns the merged metrics.
        """
        override = eval_dataset is not None
        datasets = eval_dataset if override else self.eval_dataset
        if isinstance(datasets, Mapping):
            metrics: dict[str, float] = {}
            for name, dataset in datasets.items():
                metrics.update(self.evaluate(eval_dataset=dataset if override else name, ignore_keys=ignore_keys,
                                             metric_key_prefix=f"{metric_key_prefix}_{name}"))
            return metrics
        self._memory_tracker.start()
        try:
            dataloader = self.get_eval_dataloader(eval_dataset)
            start_time = time.time()
            output = self._eval_loop_method()(dataloader, description="Evaluation",
                                              prediction_loss_only=True if self.compute_metrics is None else None,
                                              ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)
        except BaseException:
            self._memory_tracker.stop("eval")  # so that a later train/evaluate is tracked again
            raise
        metrics = output.metrics
        metrics.update(self._loop_speed(metric_key_prefix, start_time, output.num_samples))
        if self.state.epoch is not None:
            metrics["epoch"] = self.state.epoch
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        self._memory_tracker.stop_and_update_metrics(metrics)
        return metrics

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None,
                metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions (padded with -100 when lengths differ), label ids and metrics (when labels are present)."""
        self._memory_tracker.start()
        try:
            dataloader = self.get_test_dataloader(test_dataset)
            start_time = time.time()
            output = self._eval_loop_method()(dataloader, description="Prediction", ignore_keys=ignore_keys,
                                              metric_key_prefix=metric_key_prefix)
        except BaseException:
            self._memory_tracker.stop("test")
            raise
        output.metrics.update(self._loop_speed(metric_key_prefix, start_time, output.num_samples))
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, metrics=output.metrics)
        self._memory_tracker.stop_and_update_metrics(output.metrics)
        return PredictionOutput(predictions=output.predictions, label_ids=output.label_ids, metrics=output.metrics)

    def _loop_speed(self, prefix: str, start_time: float, num_samples: int) -> dict[str, float]:
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        return speed_metrics(prefix, start_time, num_samples=num_samples,
                             num_steps=math.ceil(num_samples / max(1, total_batch_size)))

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput:
        """The loop shared by ``evaluate`` and ``predict``; works with or without labels.

        Returns numpy predictions / label ids (nested like the model's outputs), prefixed metrics and the
        number of samples (``len(dataset)``, or the count seen while iterating a dataset without ``__len__``).
        """
        args = self.args
        if prediction_loss_only is None:
            prediction_loss_only = args.prediction_loss_only
        model = self._model_for_eval()
        model.eval()
        # a schedule-free optimizer evaluates its averaged weights (optimizer.eval(), as upstream), then goes back
        optimizer_in_train_mode = _schedule_free_mode(getattr(self, "optimizer", None))
        if optimizer_in_train_mode:
            self.optimizer.eval()
        self.callback_handler.eval_dataloader = dataloader
        if args.past_index >= 0:
            self._past = None
        try:
            accumulators, batch_metrics, observed = self._eval_batches(
                model, dataloader, description, prediction_loss_only, ignore_keys)
        finally:
            if args.past_index >= 0:
                self._past = None  # not carried into training (upstream deletes it; None keeps the attribute)
            if optimizer_in_train_mode:
                self.optimizer.train()
        num_samples = self._num_eval_samples(dataloader, observed)
        losses, preds, labels, inputs = (acc.result(num_samples) for acc in accumulators)
        metrics = self._eval_metrics(preds, labels, losses, inputs, batch_metrics)
        if self.compute_metrics is not None and not prediction_loss_only and not args.batch_eval_metrics:
            _warn_if_metrics_skipped(self, preds, labels, description)
        if losses is not None:
            metrics[f"{metric_key_prefix}_loss"] = _mean_loss(losses, getattr(args, "logging_nan_inf_filter", True))
        metrics = _prefix_keys(metrics, metric_key_prefix)
        return EvalLoopOutput(predictions=preds, label_ids=labels, metrics=metrics, num_samples=num_samples)

    def prediction_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> Any:
        """The seeds' legacy loop (``use_legacy_prediction_loop=True`` calls it): the same as ``evaluation_loop``."""
        return self.evaluation_loop(dataloader, description, prediction_loss_only=prediction_loss_only,
                                    ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _eval_loop_method(self) -> Any:
        """``prediction_loop`` with ``use_legacy_prediction_loop``, else ``evaluation_loop`` (as upstream picks)."""
        legacy = getattr(self.args, "use_legacy_prediction_loop", False)
        return self.prediction_loop if legacy else self.evaluation_loop

    def _eval_batches(self, model: Any, dataloader: Any, description: str, prediction_loss_only: bool,
                      ignore_keys: list[str] | None) -> tuple[list[OutputAccumulator], Any, int]:
        """Iterate the dataloader: predict, gather across ranks, accumulate; returns accumulators and counts.

        Under several processes each rank's outputs are gathered as separate parts (in rank order) and handled
        as the batches one process would have seen. A sampler that tells how many of its samples are real
        (``num_real_samples``, :class:`~trainwell.data.samplers.EvalShardSampler`) has its placeholder rows
        dropped before the gather, so they count in no loss, prediction or metric.
        """
        args = self.args
        concat = getattr(args, "eval_do_concat_batches", True)
        accumulators = [OutputAccumulator(concat=c) for c in (True, concat, concat, concat)]
        keep_outputs = not args.batch_eval_metrics or description == "Prediction"
        include = args.include_for_metrics or []
        batch_metrics_on = args.batch_eval_metrics and self.compute_metrics is not None
        accumulation_steps = args.eval_accumulation_steps
        real_left = getattr(getattr(dataloader, "sampler", None), "num_real_samples", None)
        distributed = _is_dist()
        batches: Iterable[tuple[Any, int | None]] = ((batch, None) for batch in dataloader)
        if distributed and isinstance(getattr(dataloader, "dataset", None), torch.utils.data.IterableDataset):
            import torch.distributed as dist

            batches = _round_robin(dataloader, dist.get_rank(), dist.get_world_size())
        batch_metrics, observed, steps = None, 0, 0
        for step, ((batch, placeholder), is_last) in enumerate(_mark_last(batches)):
            steps += 1
            batch_size = find_batch_size(batch)
            real = batch_size if placeholder is None else placeholder
            if real_left is not None and batch_size is not None:
                real = min(batch_size, real_left)
                real_left -= real
            observed += real or 0
            loss, logits, label = self.prediction_step(model, batch, prediction_loss_only, ignore_keys=ignore_keys)
            batch_inputs = self._inputs_for_metrics(batch) if "inputs" in include else None
            loss = self._per_sample_loss(loss, batch_size, real)
            if logits is not None and self.preprocess_logits_for_metrics is not None:
                logits = self.preprocess_logits_for_metrics(logits, label)
            outputs = (loss, *keep_rows((logits, label, batch_inputs), batch_size, real))
            if distributed:
                count = torch.tensor([real if real is not None else 1], device=_device_of(outputs))
                gather_objects = getattr(args, "eval_use_gather_object", False)
                parts = [part[1:] for part in gather_parts((count, *outputs), gather_objects) if int(part[0][0]) > 0]
            else:
                parts = [outputs]
            for i, (part_loss, part_logits, part_label, part_inputs) in enumerate(parts):
                self._add_part(accumulators, (part_loss, part_logits, part_label, part_inputs), keep_outputs)
                if batch_metrics_on and part_logits is not None and part_label is not None:
                    eval_pred = EvalPrediction(predictions=part_logits, label_ids=part_label,
                                               inputs=part_inputs if "inputs" in include else None,
                                               losses=part_loss if "loss" in include else None)
                    batch_metrics = self._call_compute_metrics(
                        eval_pred, compute_result=is_last and i == len(parts) - 1)
            self.control = self.callback_handler.on_prediction_step(args, self.state, self.control)
            if accumulation_steps and (step + 1) % accumulation_steps == 0:
                for accumulator in accumulators:
                    accumulator.flush()
        if steps == 0:
            raise ValueError(f"The {description.lower()} dataset yielded no batches; pass a non-empty dataset "
                             "(an IterableDataset must yield at least one example).")
        return accumulators, batch_metrics, observed

    @staticmethod
    def _add_part(accumulators: list[OutputAccumulator], part: tuple[Any, Any, Any, Any], keep_outputs: bool) -> None:
        """Keep one batch's (one rank's) loss, and its predictions/labels/inputs unless only metrics are kept."""
        losses, preds, labels, inputs = accumulators
        losses.add(part[0])
        if keep_outputs:
            preds.add(part[1])
            labels.add(part[2])
            inputs.add(part[3])

    @staticmethod
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

    def _inputs_for_metrics(self, batch: Mapping[str, Any]) -> Any:
        """The model's main input of a batch (``include_for_metrics=["inputs"]``), on the device."""
        name = getattr(self.model, "main_input_name", "input_ids")
        if not isinstance(batch, Mapping) or name not in batch:
            keys = list(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(f"include_for_metrics contains 'inputs' but the batch has no {name!r} entry (the "
                             f"model's main_input_name); batch keys: {keys}. Set model.main_input_name to the "
                             "input to keep, or remove 'inputs' from include_for_metrics.")
        return self._prepare_inputs({name: batch[name]})[name]

    def _num_eval_samples(self, dataloader: Any, observed: int) -> int:
        """``len(dataset)`` when the dataset has a length, else the examples counted on every rank."""
        dataset = getattr(dataloader, "dataset", None)
        try:
            num_samples = len(dataset) if dataset is not None else None
        except TypeError:
            num_samples = None
        if num_samples:
            return num_samples
        device = next((p.device for p in self.model.parameters()), torch.device("cpu")) \
            if hasattr(self.model, "parameters") else torch.device("cpu")
        return _sum_across_ranks(observed, device)

    def _eval_metrics(self, preds: Any, labels: Any, losses: Any, inputs: Any, batch_metrics: Any) -> dict[str, Any]:
        """compute_metrics on the gathered arrays (or the last batch_eval_metrics result), as python numbers."""
        include = self.args.include_for_metrics or []
        if self.args.batch_eval_metrics:
            metrics = batch_metrics
        elif self.compute_metrics is not None and preds is not None and labels is not None:
            eval_pred = EvalPrediction(predictions=preds, label_ids=labels,
                                       inputs=inputs if "inputs" in include else None,
                                       losses=losses if "loss" in include else None)
            metrics = self._call_compute_metrics(eval_pred)
        else:
            metrics = None
        if metrics is None:
            return {}
        if not isinstance(metrics, Mapping):
            raise TypeError(f"compute_metrics ({_function_name(self.compute_metrics)}) returned "
                            f"{type(metrics).__name__}; it must return a dict of metric name -> value.")
        return dict(denumpify_detensorize(dict(metrics)))

    def _call_compute_metrics(self, eval_pred: EvalPrediction, **kwargs: Any) -> Any:
        """Call compute_metrics; an error is re-raised naming the function and the shapes it was given."""
        try:
            return self.compute_metrics(eval_pred, **kwargs)
        except Exception as err:
            raise RuntimeError(
                f"compute_metrics ({_function_name(self.compute_metrics)}) failed on predictions of shape "
                f"{_shape_of(eval_pred.predictions)} and label_ids of shape {_shape_of(eval_pred.label_ids)}: "
                f"{type(err).__name__}: {err}") from err

    def prediction_step(self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]:
        """One evaluation step: ``(loss, logits, labels)``, each optional.

        Labels are taken from ``label_names`` before the forward pass; with labels (or a model that returns its
        loss without labels) the loss comes from ``compute_loss``. ``ignore_keys`` (default: the model config's
        ``keys_to_ignore_at_inference``) drops entries of a dict output; a tuple output's first element is the
        loss when there is one. One remaining output is returned as itself, several as a tuple.
        """
        label_names = list(self.label_names or [])
        has_labels = bool(label_names) and all(inputs.get(name) is not None for name in label_names)
        return_loss = inputs.get("return_loss", None)
        if return_loss is None:
            return_loss = self.can_return_loss
        loss_without_labels = not label_names and bool(return_loss)
        inputs = self._prepare_inputs(inputs)
        if ignore_keys is None:
            config = getattr(self.model, "config", None)
            ignore_keys = [] if config is None else list(
                getattr(config, "keys_to_ignore_at_inference", ["past_key_values"]) or [])
        labels = None
        if has_labels or loss_without_labels:
            labels = nested_detach(tuple(inputs.get(name) for name in label_names))
            labels = labels[0] if len(labels) == 1 else (labels or None)
        with torch.no_grad(), self.backend.autocast():
            if has_labels or loss_without_labels:
                # an override with the seeds' signature compute_loss(model, inputs, return_outputs=False) works too
                loss, outputs = call_override(self, "compute_loss", model, inputs, return_outputs=True,
                                              num_items_in_batch=None)
                loss = loss.detach().mean()
            else:
                loss, outputs = None, model(**inputs)
                if self.args.past_index >= 0:
                    self._past = _past_from(outputs, self.args.past_index - 1)
        if prediction_loss_only:
            return loss, None, None
        logits = nested_detach(_split_logits(outputs, ignore_keys, has_loss=loss is not None))
        if isinstance(logits, tuple) and len(logits) == 1:
            logits = logits[0]
        elif isinstance(logits, tuple) and not logits:
            logits = None
        return loss, logits, labels


def _past_from(outputs: Any, index: int) -> Any:
    """The memory/past state at ``index`` of a model's outputs (``args.past_index``)."""
    outputs = _outputs_as_mapping(outputs)
    values = list(outputs.values()) if isinstance(outputs, Mapping) else outputs
    return values[index] if isinstance(values, (list, tuple)) and -len(values) <= index < len(values) else None


def _warn_if_metrics_skipped(trainer: Any, preds: Any, labels: Any, description: str) -> None:
    """Warn once per reason when ``compute_metrics`` was given but could not run (upstream skips it silently)."""
    if preds is None:
        reason = ("the model returned no logits (only a loss): return them from forward (a tuple (loss, logits) or "
                  "a dict with 'logits'), and check `ignore_keys`")
    elif labels is None and description != "Prediction":  # predicting on unlabelled data is the normal case
        reason = (f"the evaluation batches have no labels (looked for {trainer.label_names}): add a 'labels' column "
                  "or set `label_names` in TrainingArguments")
    else:
        return
    warned = trainer.__dict__.setdefault("_metrics_skip_warned", set())
    if reason not in warned:
        warned.add(reason)
        warnings.warn(f"compute_metrics was not called: {reason}.", UserWarning, stacklevel=4)
