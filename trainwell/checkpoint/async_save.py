"""Asynchronous checkpoint saving (``TrainingArguments.async_save``): training blocks only for a copy to host memory.

:meth:`AsyncSaver.save` copies every state dict of a :class:`~trainwell.checkpoint.manager.CheckpointContents`
(model weights, optimizer, scheduler, extras) into host buffers, captures the RNG states and deep-copies the small
parts (trainer state, data position), then hands the copy to one background thread, which runs the ordinary
commit protocol (:mod:`trainwell.checkpoint.commit`: temporary folder, files hashed as written and fsynced together,
marker, rename) and the rotation. So the crash guarantees are those of a synchronous save: a kill during the background
write leaves the previous checkpoint as the newest valid one.

- The host buffers are reused from one save to the next (no page faults after the first save; pinned memory for
  CUDA tensors, copied with ``non_blocking`` and one synchronisation), and tensors sharing storage keep sharing it
  (tied weights are written once, as in a synchronous save). They cost host memory equal to the saved state.
- At most one save is in flight: the next save, and :meth:`AsyncSaver.wait`, wait for the previous one.
- A rank that does not write the shared files (``should_save=False``) copies nothing but its RNG states.
- A failure of the background write is kept and raised in the training thread by :meth:`AsyncSaver.raise_if_failed`
  (the trainer calls it after every optimizer step) or by the next :meth:`save` / :meth:`wait`.

Several processes (DDP): every rank runs its saver thread, and the commit's collectives (the temporary folder's
name, the barrier, the exchange of reports and outcomes) run on a dedicated gloo group (:func:`new_saver_group`,
created by every rank when the trainer is built), never on the group the training thread uses: collectives of two
threads must not interleave on one group. The commit already makes a write failure on one rank fail the save on
every rank; :meth:`AsyncSaver.wait` adds one more exchange on that group (after joining the thread, so the group is
idle) so that a failure known to one rank only (its rotation) is raised on every rank at the same point too.

Only the backends whose ``caps.async_checkpoint`` is True take part. A backend with files of its own (FSDP's DCP
shards) copies that state to host memory in the training thread too (``backend.async_engine_snapshot()``) and
writes it from the saver thread with its collectives on the saver's group. DeepSpeed's engine and the
ZeroRedundancyOptimizer write theirs synchronously with collectives on the training group: they refuse
``async_save``.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from datetime import timedelta

import torch
import torch.distributed as dist

from .layout import CheckpointError, find_disk_full
from .rng import capture_rng_state

if TYPE_CHECKING:  # pragma: no cover

    from .manager import CheckpointContents, CheckpointManager

logger = logging.getLogger(__name__)


class HostCopier:
    """Copies nested state (tensors inside dicts, lists, tuples) to host memory into buffers reused across calls.

    Each distinct tensor storage is copied once into a byte buffer and every tensor viewing it is rebuilt as the
    same view of the copy (offset, shape, strides), so shared and tied tensors stay shared. The buffers are matched
    to storages by their order of appearance and byte size: the same state copies into the same buffers each time.
    The results of one :meth:`copy` stay valid until the next call.
    """

    def __init__(self) -> None:
        self._buffers: list["torch.Tensor"] = []
        self.nbytes = 0

    def copy(self, obj: Any) -> Any:
        """A copy of ``obj`` whose tensors live in this copier's host buffers (other leaves deep-copied).

        Objects shared inside ``obj`` stay shared in the copy (as ``copy.deepcopy`` does), so it pickles alike.
        """
        memo: dict[Any, "torch.Tensor"] = {}
        seen: dict[int, Any] = {}
        cuda_used = [False]
        result = self._copy(obj, memo, seen, cuda_used)
        if cuda_used[0]:
            torch.cuda.synchronize()  # the non_blocking copies into pinned memory are done
        self.nbytes = sum(buf.numel() for buf in self._buffers)
        return result

    def _copy(self, obj: Any, memo: dict, seen: dict[int, Any], cuda_used: list[bool]) -> Any:
        if id(obj) in seen:
            return seen[id(obj)]
        if isinstance(obj, torch.Tensor):
            new: Any = self._tensor(obj, memo, cuda_used)
        elif isinstance(obj, dict):
            new = copy.copy(obj)  # keeps the type (OrderedDict, defaultdict's factory)
            for key, value in obj.items():
                new[key] = self._copy(value, memo, seen, cuda_used)
        elif isinstance(obj, list):
            new = [self._copy(value, memo, seen, cuda_used) for value in obj]
        elif isinstance(obj, tuple):
            items = [self._copy(value, memo, seen, cuda_used) for value in obj]
            new = type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        else:
            new = copy.deepcopy(obj, seen)
        seen[id(obj)] = new
        return new

    def _tensor(self, tensor: "torch.Tensor", memo: dict, cuda_used: list[bool]) -> "torch.Tensor":
        tensor = tensor.detach()
        if tensor.layout != torch.strided or tensor.is_quantized or type(tensor) is not torch.Tensor \
                or tensor.device.type not in ("cpu", "cuda"):
            return tensor.to("cpu", copy=True)  # exotic tensors: a plain copy, no reuse
        storage = tensor.untyped_storage()
        size = storage.nbytes()
        if size == 0:
            return tensor.to("cpu", copy=True)
        key = (storage.data_ptr(), str(tensor.device))
        buffer = memo.get(key)
        if buffer is None:
            index = len(memo)
            if index < len(self._buffers) and self._buffers[index].numel() == size:
                buffer = self._buffers[index]
            else:
                pin = tensor.is_cuda and torch.cuda.is_available()
                buffer = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
                if index < len(self._buffers):
                    self._buffers[index] = buffer
                else:
                    self._buffers.append(buffer)
            source = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage, 0, (size,), (1,))
            buffer.copy_(source, non_blocking=tensor.is_cuda)
            cuda_used[0] = cuda_used[0] or tensor.is_cuda
            memo[key] = buffer
        view = torch.empty(0, dtype=tensor.dtype)
        return view.set_(buffer.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


class _Frozen:
    """A state dict taken at save time, standing in for its live object in the background write."""

    def __init__(self, state: Any) -> None:
        self._state = state

    def state_dict(self) -> Any:
        return self._state


def freeze_contents(contents: "CheckpointContents", copier: HostCopier) -> "CheckpointContents":
    """``contents`` with every mutable part copied (tensors into ``copier``'s buffers): safe to write later."""
    model_state = contents.model_state_dict if contents.model_state_dict is not None else contents.model.state_dict()
    states = {"model": model_state}
    if not contents.save_only_model:
        if contents.optimizer is not None:
            states["optimizer"] = contents.optimizer.state_dict()
        if contents.scheduler is not None:
            states["scheduler"] = contents.scheduler.state_dict()
        for name, obj in contents.extra.items():
            states[f"extra:{name}"] = obj.state_dict()
    copied = copier.copy(states)
    return replace(
        contents, model_state_dict=copied["model"],
        optimizer=_Frozen(copied["optimizer"]) if "optimizer" in copied else None,
        scheduler=_Frozen(copied["scheduler"]) if "scheduler" in copied else None,
        extra={name: _Frozen(copied[f"extra:{name}"]) for name in contents.extra if f"extra:{name}" in copied},
        trainer_state=copy.deepcopy(contents.trainer_state), data_state=copy.deepcopy(contents.data_state))


def new_saver_group(timeout_s: float | None = None) -> Any:
    """A new gloo process group of every rank, for the saver thread's collectives (see the module docstring).

    A collective of the default group: every rank must call it at the same point of its program.
    """
    return dist.new_group(backend="gloo", timeout=None if timeout_s is None else timedelta(seconds=timeout_s))


class AsyncSaver:
    """Runs one checkpoint save at a time on a background thread (see the module docstring).

    ``group``: with several processes, the process group (from :func:`new_saver_group`) of the background commit's
    collectives and of the agreement in :meth:`wait`; None in a single process.
    """

    def __init__(self, *, group: Any = None) -> None:
        self.group = group
        self.copier = HostCopier()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._failed_step: int | None = None
        self.failed = False  # read after every optimizer step: a plain attribute

    @property
    def busy(self) -> bool:
        """True while a background save is running."""
        return self._thread is not None and self._thread.is_alive()

    def save(self, manager: "CheckpointManager", step: int, contents: "CheckpointContents", *,
             after: Callable[[Path], Any] | None = None,
             engine_snapshot: Callable[[], Callable[[Path, Any], None] | None] | None = None) -> Path:
        """Copy ``contents`` to host memory, start writing checkpoint ``step`` in the background; return its folder.

        Waits for the previous save first (raising its failure). ``after(folder)`` runs on the saver thread once
        the checkpoint is committed (the rotation). ``engine_snapshot()`` (the backend's
        ``async_engine_snapshot``) copies the engine's own state now and returns ``write(folder, group)``, which
        the background commit calls where a synchronous save calls the backend's ``save``.
        """
        self.wait()
        if manager.should_save:
            frozen = freeze_contents(contents, self.copier)
        else:  # this rank writes only its RNG file: no host copy of a state it does not write
            frozen = replace(contents, model_state_dict={}, optimizer=None, scheduler=None, extra={},
                             trainer_state=None, data_state=None, processing_class=None)
        # every rank writes its per-rank parts (in its RNG file): their states now, as the random streams
        frozen = replace(frozen, rank_parts={} if contents.save_only_model else {
            name: _Frozen(copy.deepcopy(obj.state_dict())) for name, obj in contents.rank_parts.items()})
        rng_state = None if contents.save_only_model else capture_rng_state()
        write_engine = engine_snapshot() if engine_snapshot is not None else None
        engine_save = None if write_engine is None else (lambda tmp: write_engine(tmp, self.group))

        def work() -> None:
            try:
                folder = manager.save(step, frozen, rng_state=rng_state, group=self.group, engine_save=engine_save)
                if after is not None:
                    after(folder)
            except BaseException as err:  # noqa: B036 - kept and raised in the training thread
                self._error, self._failed_step = err, step
                self.failed = True

        self._thread = threading.Thread(target=work, name=f"trainwell-save-{step}", daemon=False)
        self._thread.start()
        return manager.checkpoint_dir(step)

    def join(self) -> None:
        """Wait for the save in flight (if any) without raising its failure."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        """Wait for the save in flight and raise CheckpointError if it (or an earlier one) failed.

        With a ``group``, a collective: every rank calls it at the same point, and all raise when any rank's save
        failed.
        """
        self.join()
        if self.group is not None:
            self._agree()
        self.raise_if_failed()

    def _agree(self) -> None:
        """Learn the other ranks' failures (one object all-gather on the saver's group, which is idle now)."""
        mine = None if not self.failed else (self._failed_step, f"{type(self._error).__name__}: {self._error}")
        reports: list[Any] = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(reports, mine, group=self.group)
        failed = [(rank, report) for rank, report in enumerate(reports) if report is not None]
        if failed and not self.failed:
            self._failed_step = failed[0][1][0]
            self._error = CheckpointError("failed on rank(s) " + "; ".join(
                f"{rank}: {message}" for rank, (_, message) in failed))
            self.failed = True

    def raise_if_failed(self) -> None:
        """Raise CheckpointError when a background save has failed (then forget the failure)."""
        if not self.failed:
            return
        error, step = self._error, self._failed_step
        self._error, self._failed_step, self.failed = None, None, False
        full = find_disk_full(error)
        if full is not None:  # the cause and its fixes first (trainwell's disk-full message is the strerror)
            raise CheckpointError(f"{full.strerror or full} (the background save of checkpoint-{step}, "
                                  "async_save=True)") from error
        raise CheckpointError(f"the background save of checkpoint-{step} failed ({type(error).__name__}: {error}); "
                              "the previous checkpoints are intact (async_save=True)") from error
