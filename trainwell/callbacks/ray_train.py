"""Ray Train's Hugging Face helpers for trainwell, without transformers: ``from trainwell.integrations.ray_train
import RayTrainReportCallback, prepare_trainer``.

The same names, arguments and behaviour as ``ray.train.huggingface.transformers``'s, which also work on a trainwell
Trainer (their ``prepare_trainer`` subclasses ``type(trainer)``, their callback only reads ``args`` and ``state``),
but import ``transformers.trainer`` when imported: seconds per Ray worker, and an error where transformers is not
installed. These import only Ray, when called. Two differences, both on the safe side:

* the checkpoint reported after a save is the newest *complete* one (trainwell's ``get_last_checkpoint``: its
  completion marker is there, so a resume from ``ray.train.get_checkpoint()`` verifies every file against it);
* one process per node copies it (the node's local main process; the others report metrics only), where Ray's copies
  it from every process into the same Ray checkpoint. Ray merges what the nodes report, so per-node shards all reach it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator, TypeVar

from torch.utils.data import DataLoader, IterableDataset

from ..checkpoint.layout import get_last_checkpoint
from .base import TrainerCallback

_T = TypeVar("_T")


def _ray_train() -> Any:
    try:
        import ray.train
    except ImportError as err:
        raise ImportError("trainwell.integrations.ray_train needs Ray Train: pip install 'ray[train]'") from err
    return ray.train


class RayTrainReportCallback(TrainerCallback):
    """After each checkpoint save, reports the metrics logged so far (``state.log_history`` merged, newest values
    winning) and a copy of the newest complete checkpoint to Ray Train with ``ray.train.report``.

    Ray's checkpoint holds the trainwell checkpoint in its sub-folder :attr:`CHECKPOINT_NAME` (``checkpoint``), so a
    restarted worker resumes with ``trainer.train(resume_from_checkpoint=os.path.join(folder, "checkpoint"))``.
    Every process calls ``ray.train.report`` at every save (Ray's rule: it is a barrier across the workers).
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Report the merged metrics and (from each node's main process) the newest complete checkpoint."""
        train = _ray_train()
        metrics: dict[str, Any] = {}
        for entry in state.log_history:
            metrics.update(entry)
        source = get_last_checkpoint(args.output_dir) if args.local_process_index == 0 else None
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if source is not None:
                shutil.copytree(source, Path(folder, self.CHECKPOINT_NAME))
                checkpoint = train.Checkpoint.from_directory(folder)
            train.report(metrics=metrics, checkpoint=checkpoint)


class _RayIterableDataset:
    """A Ray Data iterable as a torch ``IterableDataset`` (its batches are already collated)."""

    def __init__(self, iterable: Any) -> None:
        self.iterable = iterable

    def __iter__(self) -> Iterator[Any]:
        return iter(self.iterable)


def _ray_loader(dataset: Any) -> "DataLoader":
    wrapped = type("RayTorchIterableDataset", (_RayIterableDataset, IterableDataset), {})(dataset)
    return DataLoader(wrapped, batch_size=1, collate_fn=lambda batch: batch[0])


def _is_ray_iterable(dataset: Any) -> bool:
    from ray.data.iterator import _IterableFromIterator

    return isinstance(dataset, _IterableFromIterator)


def prepare_trainer(trainer: _T) -> _T:
    """Let ``trainer`` train on Ray Data: a train or eval dataset that is a Ray Data iterable (``ray.train.
    get_dataset_shard(...).iter_torch_batches(...)``) is read batch by batch as Ray yields it; any other dataset is
    loaded as before. Changes the class of ``trainer`` in place (to a subclass of its class) and returns it, as Ray's.
    """
    _ray_train()
    base: type = type(trainer)

    class RayTransformersTrainer(base):
        """``type(trainer)`` reading Ray Data iterables as they come."""

        def get_train_dataloader(self) -> "DataLoader":
            if _is_ray_iterable(self.train_dataset):
                return _ray_loader(self.train_dataset)
            return super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> "DataLoader":
            dataset = self.eval_dataset if eval_dataset is None else eval_dataset
            if isinstance(dataset, str) and isinstance(self.eval_dataset, dict):
                named = self.eval_dataset[dataset]
                if _is_ray_iterable(named):
                    return _ray_loader(named)
            elif _is_ray_iterable(dataset):
                return _ray_loader(dataset)
            return super().get_eval_dataloader(eval_dataset)

    trainer.__class__ = RayTransformersTrainer
    return trainer


__all__ = ["RayTrainReportCallback", "prepare_trainer"]
