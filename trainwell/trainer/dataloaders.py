"""The Trainer's DataLoaders: column removal, the collator, a seekable sampler sharded over ranks, seeded workers.

Functions of the :class:`~trainwell.trainer.trainer.Trainer` facade (``get_train_dataloader``,
``_get_train_sampler``, ``_get_eval_sampler`` and the evaluation loaders delegate here; loaded at the first loader,
not by ``import trainwell``). The samplers are asked for through the Trainer's methods, so that an override of
``_get_train_sampler`` / ``_get_eval_sampler`` (upstream names) is reached.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from ..data.columns import RemoveColumnsCollator, remove_unused_columns_from_dataset
from ..data.loader import build_dataloader, has_length, stateful_loader_class
from ..data.sharding import is_sharded, seed_random_sampler_by_epoch, shard_dataloader
from ..utils.model_utils import unwrap_model
from ..utils.overrides import call_override
from ..utils.preflight import check_dataset
from ..utils.seeding import seed_worker
from ..data.length_check import LengthCheckedIterable
from ..data.samplers import LengthGroupedSampler, ResumableSampler, infer_lengths, EvalShardSampler

if TYPE_CHECKING:
    from torch import nn

    from ..args.fields import TrainingArguments

logger = logging.getLogger("trainwell.trainer.trainer")


class DataTrainer(Protocol):
    """What the DataLoaders use of the Trainer (trainer.py imports this module, so the Trainer is not named here)."""

    args: TrainingArguments
    model: nn.Module
    data_collator: Any
    _signature_columns: list[str] | None
    _eval_dataloaders: dict[str, Any]  # upstream's: the loaders kept under dataloader_persistent_workers

    def _remove_unused_columns(self, dataset: Any, description: str | None = None) -> Any: ...

    def _get_collator_with_removed_columns(self, data_collator: Any, description: str | None = None) -> Any: ...

    def _set_signature_columns_if_needed(self) -> None: ...


#: upstream's loader descriptions -> the dataset's name in trainwell's messages
_DATASET_NAMES = {"Training": "train", "Evaluation": "eval_dataset", "test": "test_dataset"}


def trainer_dataloader(trainer: DataTrainer, dataset: Any, description: str, batch_size: int,
                       sampler_fn: Callable[[Any], Any] | None = None, is_training: bool = False,
                       dataloader_key: str | None = None) -> Any:
    """``Trainer._get_dataloader`` (upstream's signature): a DataLoader over ``dataset`` with column removal, the
    collator, the sampler ``sampler_fn(dataset)`` (none for an iterable dataset) and, for training, seeded workers.

    ``description`` is upstream's (``"Training"``, ``"Evaluation"``, ``"test"``), passed on to the column-removal
    methods as there. Under ``dataloader_persistent_workers`` a loader with a ``dataloader_key`` (an evaluation
    set's name, or ``"eval"``) is kept in ``trainer._eval_dataloaders`` (upstream's attribute), which
    ``get_eval_dataloader`` returns again for the same dataset, so its workers persist across evaluations.
    """
    name = _DATASET_NAMES.get(description, description)
    if dataset is None:
        raise ValueError(f"Trainer: this call requires a {name} dataset "
                         f"(pass `{name}_dataset=` to the Trainer or to the method)")
    check_dataset(dataset, name.removesuffix("_dataset"))  # also for datasets passed to evaluate()/predict()
    if has_length(dataset) and len(dataset) == 0:
        raise ValueError(f"The {name} dataset is empty (len() == 0); pass a dataset with at least one item")
    args, collator, source = trainer.args, trainer.data_collator, dataset
    # upstream's overridable steps, called as upstream calls them (each does nothing without remove_unused_columns)
    if hasattr(dataset, "column_names") and hasattr(dataset, "remove_columns"):  # a datasets.Dataset
        dataset = trainer._remove_unused_columns(dataset, description=description)
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description=description)
    sampler, loader_class = None, None
    if is_training and args.dataloader_num_workers > 0 and _has_position(dataset):
        # the stream's position lives in the worker processes: torchdata's loader collects it (when installed)
        loader_class = stateful_loader_class()
    if isinstance(dataset, torch.utils.data.IterableDataset):
        if has_length(dataset) and args.dataloader_num_workers == 0:
            dataset = LengthCheckedIterable(dataset, name.removesuffix("_dataset"))  # yielding != __len__ raises
    elif sampler_fn is not None:
        sampler = _sample(trainer, sampler_fn, dataset)
    # As upstream: no generator, so each pass draws its workers' base seed from the global torch stream (one
    # int64), and only the training loader reseeds its workers per rank; the same seed gives the same numbers.
    workers = args.dataloader_num_workers
    worker_init = partial(seed_worker, num_workers=workers, rank=args.process_index) if is_training else None
    loader = build_dataloader(
        dataset, batch_size=batch_size, collate_fn=collator, sampler=sampler,
        drop_last=args.dataloader_drop_last, num_workers=workers,
        pin_memory=args.dataloader_pin_memory and args.device.type == "cuda",
        persistent_workers=args.dataloader_persistent_workers,
        prefetch_factor=args.dataloader_prefetch_factor, worker_init_fn=worker_init, num_processes=args.world_size,
        multiprocessing_context=getattr(args, "dataloader_multiprocessing_context", None),
        in_order=getattr(args, "dataloader_in_order", True), loader_class=loader_class)
    if sampler is not None and args.world_size > 1 and not is_sharded(sampler):
        # A sampler of an override (TRL's RepeatSampler, a script's): split as upstream's accelerator.prepare splits
        # every loader of _get_dataloader (trainwell's own samplers shard themselves)
        loader = shard_dataloader(seed_random_sampler_by_epoch(loader), num_processes=args.world_size,
                                  process_index=args.process_index)
    if dataloader_key is not None and args.dataloader_persistent_workers:
        loader._tw_source_dataset = source  # the dataset asked for (column removal may have made another)
        trainer._eval_dataloaders[dataloader_key] = loader
    return loader


def _has_position(dataset: Any) -> bool:
    """Whether ``dataset`` is a stream that can say its position (``state_dict`` / ``load_state_dict``)."""
    return isinstance(dataset, torch.utils.data.IterableDataset) and all(
        callable(getattr(dataset, name, None)) for name in ("state_dict", "load_state_dict"))


def _sample(trainer: DataTrainer, sampler_fn: Callable[[Any], Any], dataset: Any) -> Any:
    """``sampler_fn(dataset)``; the Trainer's own ``_get_train_sampler`` through :func:`call_override`, since an
    override written for older releases takes no dataset and reads ``self.train_dataset``."""
    if getattr(sampler_fn, "__self__", None) is trainer and getattr(sampler_fn, "__name__", "") == "_get_train_sampler":
        return call_override(trainer, "_get_train_sampler", dataset)
    return sampler_fn(dataset)


def remove_unused_columns(trainer: DataTrainer, dataset: Any, description: str | None = None) -> Any:
    """The default ``_remove_unused_columns``: ``dataset`` without the columns outside
    ``trainer._signature_columns`` (unchanged without ``remove_unused_columns``)."""
    if not trainer.args.remove_unused_columns:
        return dataset
    trainer._set_signature_columns_if_needed()
    return remove_unused_columns_from_dataset(dataset, trainer._signature_columns or [], description=description,
                                              model_name=type(unwrap_model(trainer.model)).__name__, logger=logger)


def collator_with_removed_columns(trainer: DataTrainer, collator: Any, description: str | None = None) -> Any:
    """The default ``_get_collator_with_removed_columns``: ``collator`` behind a :class:`RemoveColumnsCollator` of
    ``trainer._signature_columns`` (``collator`` itself without ``remove_unused_columns``)."""
    if not trainer.args.remove_unused_columns:
        return collator
    trainer._set_signature_columns_if_needed()
    return RemoveColumnsCollator(collator, trainer._signature_columns or [], logger=logger,
                                 model_name=type(unwrap_model(trainer.model)).__name__, description=description)


def _groups_by_length(args: Any) -> bool:
    """``train_sampling_strategy="group_by_length"`` (or the seeds' ``group_by_length=True``)."""
    strategy = getattr(args, "train_sampling_strategy", "random")  # arguments of another class may lack it
    return strategy == "group_by_length" or (strategy == "random" and getattr(args, "group_by_length", False))


def model_input_name(processing_class: Any) -> str:
    """The key whose length ``group_by_length`` measures: the processing class's first model input (a tokenizer's
    ``input_ids``, a feature extractor's ``input_values``...), as upstream; ``input_ids`` without one."""
    names = getattr(processing_class, "model_input_names", None)
    return names[0] if names else "input_ids"


def _lengths(args: Any, dataset: Any, input_name: str) -> list[int]:
    return infer_lengths(dataset, input_name, length_column_name=args.length_column_name)


def _data_seed(args: Any) -> int:
    return args.data_seed if args.data_seed is not None else args.seed


def train_sampler(args: Any, dataset: Any, batch_size: int, *, input_name: str = "input_ids") -> Any:
    """Seekable sampler of ``args.train_sampling_strategy``, sharded over ranks: ``"random"`` shuffles per epoch,
    ``"sequential"`` keeps the dataset's order, ``"group_by_length"`` (or the seeds' ``group_by_length=True``)
    groups similar lengths (the ``length_column_name`` column, else each example's ``input_name``) in mega-batches
    of one accumulation window, as upstream's ``_get_train_sampler``."""
    # ranks take whole batches in turn, as upstream's under accelerate (the same examples on the same rank)
    common = dict(seed=_data_seed(args), num_replicas=args.world_size, rank=args.process_index,
                  shard_batch_size=batch_size)
    if _groups_by_length(args):
        lengths = _lengths(args, dataset, input_name)
        return LengthGroupedSampler(batch_size * args.gradient_accumulation_steps, lengths=lengths, **common)
    strategy = getattr(args, "train_sampling_strategy", "random")
    return ResumableSampler(len(dataset), shuffle=strategy != "sequential", drop_last=args.dataloader_drop_last,
                            **common)


def eval_sampler(args: Any, dataset: Any, *, input_name: str = "input_ids") -> Any:
    """The evaluation and prediction order, as upstream's ``_get_eval_sampler``: the dataset's, or with
    ``group_by_length`` a length-grouped one in mega-batches of ``eval_batch_size`` drawn from a generator seeded
    with ``data_seed`` (else ``seed``), the same at every evaluation. Distributed, each rank takes a contiguous share
    of every global batch of that order, so the gathered batches restore it."""
    order = None
    if _groups_by_length(args):
        grouped = LengthGroupedSampler(args.eval_batch_size, lengths=_lengths(args, dataset, input_name),
                                       generator=torch.Generator().manual_seed(_data_seed(args)))
        if args.world_size <= 1:
            return grouped
        order = list(grouped)
    if args.world_size <= 1:
        return torch.utils.data.SequentialSampler(dataset)
    return EvalShardSampler(len(dataset), batch_size=args.eval_batch_size, num_replicas=args.world_size,
                            rank=args.process_index, drop_last=args.dataloader_drop_last, order=order)
