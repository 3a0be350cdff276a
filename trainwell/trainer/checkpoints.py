"""The Trainer's checkpoint glue: what goes into ``checkpoint-<step>``, resume, best model, ``save_model``.

A mixin of :class:`trainwell.trainer.trainer.Trainer` (kept apart so the facade stays small); the file work itself
(atomic folders, validation, rotation, RNG) is :mod:`trainwell.checkpoint`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..backends.base import WeightsNotGathered
from ..checkpoint.layout import (TRAINER_STATE_NAME, TRAINING_ARGS_JSON_NAME, TRAINING_ARGS_NAME, cleanup_incomplete,
                                list_complete_checkpoints, list_foreign_checkpoints, list_resumable_checkpoints)
from ..checkpoint.manager import CheckpointContents, CheckpointManager
from ..loops.train_loop import DataPosition
from ..utils.model_utils import unwrap_model
from ..utils.overrides import call_override
from ..callbacks.state import TrainerState

if TYPE_CHECKING:  # imported where used: `from trainwell import Trainer` does not load them
    from ..checkpoint.async_save import AsyncSaver
    from ..checkpoint.lock import OutputDirLock, OutputDirLockedError
    from ..checkpoint.preemption import PreemptionGuard

logger = logging.getLogger("trainwell.trainer.trainer")

# With several processes the ranks agree on a stop only every this many optimizer steps (one all-reduce of a flag),
# so that the steps in between carry no extra collective nor device synchronisation.
PREEMPTION_SYNC_STEPS = 10


class TrainerCheckpointing:
    """Checkpoint methods of the Trainer (expects the Trainer's attributes: args, state, backend, model...)."""

    def _init_checkpointing(self) -> None:
        args = self.args
        self._checkpoints = CheckpointManager(args.output_dir, save_total_limit=args.save_total_limit,
                                              rank=args.process_index, world_size=args.world_size,
                                              should_save=args.should_save,
                                              trust_pickles=bool(getattr(args, "trust_checkpoint_pickles", False)))
        self._last_checkpoint: Path | None = None  # the newest checkpoint the current train() call wrote
        self._resumed_from: Path | None = None  # the checkpoint the current train() call resumed from
        # How the preemption warning tells the user to continue (the CLI prints its own command instead: None).
        self._preemption_hint: str | None = "continue with train(resume_from_checkpoint=True)"
        self._resume_with_fallback = False
        self._output_dir_lock: OutputDirLock | None = None
        self.preempted = False
        self.preempted_by: str | None = None  # the signal's name ("SIGTERM") when a signal stopped the run
        self._preemption: PreemptionGuard | None = None
        self._preemption_collective = False
        self.preemption_sync_steps = PREEMPTION_SYNC_STEPS
        self._async_saver: AsyncSaver | None = None
        if getattr(args, "async_save", False):
            self._async_saver = self._new_async_saver()

    def _new_async_saver(self) -> AsyncSaver:
        """The saver of ``async_save=True``, with its own gloo group when several processes train (a collective)."""
        if not self.backend.caps.async_checkpoint:
            raise ValueError(
                f"async_save=True is not supported by the {type(self.backend).__name__} backend: its checkpoint is "
                "written by an engine (DeepSpeed's save_checkpoint, the ZeroRedundancyOptimizer state of "
                "sharded_ddp) synchronously, with collectives on the training process group, so it cannot run in "
                "a background thread; set async_save=False (one process, DDP and FSDP support it)")
        from ..checkpoint.async_save import AsyncSaver
        from ..runtime.distributed import is_dist

        if self.args.world_size > 1 and is_dist():
            from ..checkpoint.async_save import new_saver_group

            return AsyncSaver(group=new_saver_group(timeout_s=getattr(self.args, "ddp_timeout", None)))
        return AsyncSaver()

    def _contents(self, *, tr_loss: torch.Tensor | None = None, stream: bool = False) -> CheckpointContents:
        """Everything resumable, as the checkpoint package expects it.

        ``stream``: a sharded model's weights are gathered one tensor at a time while they are written (a
        synchronous save); otherwise (an asynchronous save's snapshot) they are gathered whole now.
        """
        # every rank's running loss is gathered (a collective: _contents runs on every rank at save time)
        data_state = self._loop.data_state(self.state.global_step) if tr_loss is not None else None
        sharded = self.backend.caps.sharded_state
        return CheckpointContents(
            # A sharded backend saves and loads the optimizer state itself (collectively, in backend.save/load).
            model=unwrap_model(self.model), optimizer=None if sharded else self.optimizer, scheduler=self.lr_scheduler,
            extra=dict(self.backend.state_dicts()), trainer_state=self.state, args=self.args,
            data_state=data_state, processing_class=self.processing_class,
            save_only_model=self.args.save_only_model, safe_serialization=self.args.save_safetensors,
            model_state_dict=None if not sharded else (self.backend.stream_state_dict(model_save=False) if stream
                                                         else self.backend.full_state_dict()))

    def _resolve_resume(self, resume_from_checkpoint: str | bool | None) -> Path | None:
        """The checkpoint folder to resume from (None to start fresh).

        Takes the ``output_dir`` lock first (world process zero; released by :meth:`_release_output_dir`), then
        removes the temporary folders of interrupted trainwell saves. Foreign checkpoints are left alone.
        """
        if resume_from_checkpoint is None and self.args.resume_from_checkpoint:
            resume_from_checkpoint = self.args.resume_from_checkpoint
        self._lock_output_dir()
        try:
            if self.args.should_save:
                removed = cleanup_incomplete(self.args.output_dir, at_startup=True)
                if removed:
                    logger.warning("Removed incomplete checkpoint folders left by an interrupted save: %s",
                                   [str(p) for p in removed])
            self._wait_for_cleanup()
            resume_from_checkpoint = self._resolve_auto(resume_from_checkpoint)
            self._resume_with_fallback = resume_from_checkpoint is True
            folder = self._checkpoints.resolve_resume(resume_from_checkpoint)
        except BaseException:
            self._release_output_dir()
            raise
        self._warn_foreign_checkpoints(folder)
        self._warn_earlier_run(folder)
        self._last_checkpoint, self._resumed_from = None, folder
        return folder

    def _checkpoint_of_this_run(self) -> Path | None:
        """The newest checkpoint the current ``train()`` call wrote, else the one it resumed from; never a
        checkpoint another run left in ``output_dir``."""
        return self._last_checkpoint or self._resumed_from

    def _warn_earlier_run(self, resume_from: Path | None) -> None:
        """A fresh run into a folder holding an earlier run's checkpoints says so loudly: they are not this run's,
        and the newest of them stays what ``resume_from_checkpoint=True`` would pick."""
        if resume_from is not None or not self.args.should_save or not self.args.output_dir:
            return
        earlier = list_complete_checkpoints(self.args.output_dir)
        if earlier and not self.args.overwrite_output_dir:
            logger.warning("output_dir %s holds checkpoints of an earlier run (%s); this run starts from scratch and "
                           "writes next to them, and its final model replaces that run's. Continue that run with "
                           "train(resume_from_checkpoint=True), or use another output_dir.", self.args.output_dir,
                           ", ".join(p.name for p in earlier[-3:]))

    def _wait_for_cleanup(self) -> None:
        """Every rank waits for the saving rank's clean-up: it may have promoted an interrupted save's folder
        into place (the newest checkpoint), which every rank must see when it decides where to resume."""
        if self.args.world_size > 1:
            from ..runtime.distributed import barrier, is_dist

            if is_dist():
                barrier()

    def _resolve_auto(self, resume_from_checkpoint: str | bool | None) -> str | bool | None:
        """``"auto"``: True (newest valid checkpoint, with fallback) when ``output_dir`` holds one, else None (fresh).

        One command then serves the first attempt of a job and every requeued one; the choice is logged.
        """
        if not (isinstance(resume_from_checkpoint, str) and resume_from_checkpoint.strip().lower() == "auto"):
            return resume_from_checkpoint
        found = list_resumable_checkpoints(self.args.output_dir) if self.args.output_dir else []
        if found:
            logger.warning("resume_from_checkpoint='auto': resuming from the newest checkpoint of %s (%s; an older "
                           "one is used if it is damaged)", self.args.output_dir, found[-1].name)
            return True
        logger.warning("resume_from_checkpoint='auto': no checkpoint in %s; training from scratch", self.args.output_dir)
        return None

    def _lock_output_dir(self) -> None:
        """World process zero takes the ``output_dir`` lock; with several processes every rank learns the outcome
        (one gather of a short string), so all of them fail together instead of waiting for rank 0."""
        from ..checkpoint.lock import OutputDirLock, OutputDirLockedError

        error: OutputDirLockedError | None = None
        if self.args.process_index == 0 and self._output_dir_lock is None and self.args.output_dir:
            lock = OutputDirLock(self.args.output_dir)
            try:
                lock.acquire()
                self._output_dir_lock = lock
            except OutputDirLockedError as err:
                error = err
            except OSError as err:  # a read-only output_dir: nothing of this run can collide there
                logger.warning("Could not lock output_dir %s (%s); training without the lock, so make sure no other "
                               "trainer uses this folder", self.args.output_dir, err)
        if self.args.world_size > 1:
            from ..runtime.distributed import all_gather_object, is_dist

            if is_dist():
                message = all_gather_object(str(error) if error is not None else None)[0]
                if message is not None and error is None:
                    error = OutputDirLockedError(f"(reported by rank 0) {message}")
        if error is not None:
            raise error

    def _warn_foreign_checkpoints(self, resume_from: Path | None) -> None:
        """Foreign checkpoints newer than the start are kept; a save at one of their steps would fail: say so now."""
        if not self.args.should_save or self.args.save_strategy == "no":
            return
        start = resume_from.resolve() if resume_from is not None else None
        newer = [p for p in list_foreign_checkpoints(self.args.output_dir) if p.resolve() != start]
        if newer:
            logger.warning("output_dir holds checkpoint folders trainwell did not write (no marker): %s. They are "
                           "never deleted nor rotated, and a save at the same step fails instead of replacing them; "
                           "move them elsewhere if this run may reach those steps.", [p.name for p in newer])

    def _release_output_dir(self) -> None:
        """Release the ``output_dir`` lock taken by :meth:`_resolve_resume` (a no-op when not held).

        A background save still in flight (``train()`` raised) is waited for first: it writes into ``output_dir``.
        """
        if self._async_saver is not None:
            self._async_saver.join()
        lock, self._output_dir_lock = self._output_dir_lock, None
        if lock is not None:
            lock.release()

    def _load_training_checkpoint(self, folder: Path) -> DataPosition:
        """Restore model, optimizer, scheduler, scaler, RNG, TrainerState and the data position."""
        from ..backends.elastic import check_resumable

        # another backend's optimizer state is refused now, on every rank, before anything is loaded
        check_resumable(folder, deepspeed=bool(getattr(self.args, "deepspeed", None)), world_size=self.args.world_size)
        contents = self._contents()
        # Every rank validates, agrees and loads together (trainwell's files, then the engine's); see
        # trainwell.checkpoint.agreement.
        options = dict(load_trainer_state=TrainerState.load_from_json, engine_load=self.backend.load,
                       engine_check=self.backend.check_checkpoint, context=self._whole_parameters)
        if self._resume_with_fallback:
            folder, result = self._checkpoints.load_latest_valid(contents, **options)
        else:
            result = self._checkpoints.load_agreed(folder, contents, **options)
        logger.info("Resuming training from %s", folder)
        self._adopt_state(result["trainer_state"])
        data_state = result["data_state"]
        if data_state is not None and self._data_shape_changed(data_state, folder):
            data_state = {k: v for k, v in data_state.items() if k not in ("epoch", "batches_in_epoch")}
        if data_state is None or "epoch" not in data_state:
            # written by another tool, or for another epoch shape: derive the position from the step (as upstream)
            per_epoch = self._plan.updates_per_epoch or 1
            data_state = {**(data_state or {}), "epoch": self.state.global_step // per_epoch,
                          "batches_in_epoch": (self.state.global_step % per_epoch)
                          * self.args.gradient_accumulation_steps}
        if "last_logged_step" not in data_state:
            # no loss accumulators (another tool's checkpoint): the first logging window starts here, as upstream's
            data_state["last_logged_step"] = self.state.global_step
        position = DataPosition.from_dict(data_state)
        if self.state.global_step >= self._plan.max_steps:
            # A finished run's final checkpoint (a requeue after the end): no step past max_steps (upstream trains one
            # more when the last step falls mid-epoch). An empty epoch range ends the loop before its first step.
            logger.info("Training is already complete: the checkpoint is at global_step %d and max_steps is %d; no "
                        "further step is trained.", self.state.global_step, self._plan.max_steps)
            position.epoch, position.batches_in_epoch = self._plan.num_epochs, 0
        return position

    def _data_shape_changed(self, data_state: dict[str, Any], folder: Path) -> bool:
        """Whether the saved position counts batches of another size or epochs of another length (then warn)."""
        plan, saved_batch = self._plan, data_state.get("train_batch_size")
        saved_per_epoch = data_state.get("batches_per_epoch")
        changes = []
        if saved_batch is not None and saved_batch != self._train_batch_size:
            changes.append(f"train_batch_size {saved_batch} -> {self._train_batch_size}")
        if saved_per_epoch is not None and plan.micro_batches_per_epoch is not None and \
                saved_per_epoch != plan.micro_batches_per_epoch:
            changes.append(f"batches per epoch {saved_per_epoch} -> {plan.micro_batches_per_epoch}")
        if not changes:
            return False
        if self._same_global_batch(data_state, folder):
            # another number of processes, the same global batch: the position derived from the step is exact
            logger.info("The checkpoint was written by another number of processes (%s): the data position is "
                        "derived from global_step %d", ", ".join(changes), self.state.global_step)
            return True
        logger.warning("The checkpoint was written with another data shape (%s): the exact data position cannot "
                       "be restored, so training continues from global_step %d (epoch and batch derived from it, "
                       "as upstream). Keep per_device_train_batch_size and the dataset unchanged for an exact "
                       "resume.", ", ".join(changes), self.state.global_step)
        return True

    def _same_global_batch(self, data_state: dict[str, Any], folder: Path) -> bool:
        """Whether the checkpoint's run had this run's global batch and epoch, over another number of processes."""
        import json

        try:
            saved_ga = json.loads((folder / TRAINING_ARGS_JSON_NAME).read_text()).get("gradient_accumulation_steps")
        except (OSError, ValueError, AttributeError):
            return False
        saved_ranks = len(data_state.get("tr_loss_per_rank") or [])
        saved_batch, saved_per_epoch = data_state.get("train_batch_size"), data_state.get("batches_per_epoch")
        per_epoch, args = self._plan.micro_batches_per_epoch, self.args
        if saved_ranks in (0, args.world_size) or None in (saved_ga, saved_batch, saved_per_epoch, per_epoch):
            return False
        return (saved_batch * saved_ga * saved_ranks == self._train_batch_size * args.gradient_accumulation_steps
                * args.world_size and saved_batch * saved_per_epoch * saved_ranks
                == self._train_batch_size * per_epoch * args.world_size)

    def _whole_parameters(self) -> Any:
        """A context in which a sharded backend's parameters are whole, so full weights load into them (ZeRO-3)."""
        return self.backend.gathered_parameters()

    def _adopt_state(self, loaded: TrainerState | None) -> None:
        if loaded is None:
            return
        plan = self._plan
        loaded.is_local_process_zero = self.is_local_process_zero()
        loaded.is_world_process_zero = self.is_world_process_zero()
        loaded.compute_steps(self.args, plan.max_steps)
        loaded.max_steps = plan.max_steps
        loaded.num_train_epochs = plan.num_epochs
        loaded.train_batch_size = self._train_batch_size
        self.state = loaded
        if self.args.restore_callback_states_from_checkpoint and loaded.stateful_callbacks:
            self._restore_callback_states(loaded.stateful_callbacks)

    def _restore_callback_states(self, saved: dict[str, Any]) -> None:
        """Restore ``stateful_callbacks`` (upstream's format) onto this trainer's callbacks and control.

        Saved states are matched to the callbacks of the same class name, in order (the k-th saved state of a class
        goes to its k-th callback). Each callback is rebuilt from the saved constructor ``args`` (the new instance's
        fields are copied into the existing object, so references the user holds see the restored state), then the
        saved ``attributes`` are set. States without a matching callback are reported and ignored.
        """
        exportable = [cb for cb in self.callback_handler.callbacks if _is_exportable(cb)]
        not_found = []
        for name, entries in saved.items():
            entries = entries if isinstance(entries, list) else [entries]
            if name == type(self.control).__name__:
                self.control = _rebuilt(self.control, entries[0])
                continue
            targets = [cb for cb in exportable if type(cb).__name__ == name]
            if not targets:
                not_found.append(name)
            elif len(targets) != len(entries):
                logger.warning("The checkpoint holds %d states of %s but the trainer has %d such callbacks; restoring "
                               "the first %d in order", len(entries), name, len(targets),
                               min(len(entries), len(targets)))
            for callback, entry in zip(targets, entries):
                _rebuilt(callback, entry)
        if not_found:
            logger.warning("Checkpoint included callbacks not included in current configuration. Ignoring. (%s)",
                           ", ".join(not_found))

    def _export_callback_states(self) -> dict[str, Any]:
        """``{class name: state()}`` (a list of states for several callbacks of one class), the control last."""
        exported: dict[str, Any] = {}
        for callback in [*self.callback_handler.callbacks, self.control]:
            if not _is_exportable(callback):
                continue
            name, state = type(callback).__name__, callback.state()
            if name not in exported:
                exported[name] = state
            elif isinstance(exported[name], list):
                exported[name].append(state)
            else:
                exported[name] = [exported[name], state]
        return exported

    def _save_checkpoint(self, model: nn.Module, trial: Any, tr_loss: torch.Tensor | None = None) -> Path:
        """Write ``checkpoint-<global_step>`` atomically, then rotate old ones.

        A second Ctrl-C during the save (a stop was already requested) quits at once, saying which checkpoint is
        left to resume from.
        """
        try:
            return self._write_checkpoint(tr_loss)
        except KeyboardInterrupt:
            guard = self._preemption
            if guard is None or not guard.requested:
                raise
            self._close_progress_bars()
            newest = list_complete_checkpoints(self.args.output_dir)
            raise KeyboardInterrupt(
                f"second {guard.signal_name or 'interrupt'} during the save of step {self.state.global_step}: "
                f"quitting without that checkpoint; the newest valid one is "
                f"{newest[-1] if newest else 'none (nothing to resume from)'}") from None

    def _write_checkpoint(self, tr_loss: torch.Tensor | None) -> Path:
        step = self.state.global_step
        folder = self._checkpoints.checkpoint_dir(step)
        if self.state.best_global_step == step and self.args.metric_for_best_model:
            self.state.best_model_checkpoint = str(folder)
        self.store_flos()
        self.state.stateful_callbacks = self._export_callback_states()
        self._checkpoints.engine_needs_shared_folder = self.backend.caps.engine_needs_shared_folder
        if self._async_saver is not None:  # written and rotated in the background; see checkpoint.async_save
            best = self.state.best_model_checkpoint
            folder = self._async_saver.save(self._checkpoints, step, self._contents(tr_loss=tr_loss),
                                            after=lambda _: self._checkpoints.rotate(best_model_checkpoint=best),
                                            engine_snapshot=self.backend.async_engine_snapshot)
            self._last_checkpoint = folder
            if self.args.push_to_hub:  # the push reads the checkpoint: wait until it is committed
                self._async_saver.wait()
                self._push_from_checkpoint(folder)
            return folder
        # The backend's engine files go into the temporary folder before the marker (one commit for every rank).
        folder = self._checkpoints.save(step, self._contents(tr_loss=tr_loss, stream=True),
                                        engine_save=self.backend.save)
        self._last_checkpoint = folder
        self._push_from_checkpoint(folder)
        self._checkpoints.rotate(best_model_checkpoint=self.state.best_model_checkpoint)
        return folder

    def _wait_for_checkpoint(self) -> None:
        """Wait for an asynchronous save in flight; raise its failure (a no-op without ``async_save``)."""
        if self._async_saver is not None:
            self._async_saver.wait()

    @contextmanager
    def _preemption_scope(self) -> Iterator[PreemptionGuard]:
        """Turn SIGTERM/SIGINT into a graceful stop for the duration of ``train()`` (see :meth:`_stop_if_preempted`)."""
        self.preempted = False
        self.preempted_by = None
        from ..checkpoint.preemption import PreemptionGuard

        self._preemption_collective = self.args.world_size > 1
        with PreemptionGuard() as guard:
            self._preemption = guard
            try:
                yield guard
            finally:
                self._preemption = None

    def _preemption_requested(self) -> bool:
        """Whether a stop was asked for; cheap in one process (a flag read), a collective every N steps otherwise."""
        guard = self._preemption
        if guard is None:
            return False
        if not self._preemption_collective:
            return guard.requested
        if self.state.global_step % max(1, self.preemption_sync_steps):
            return False
        saver = self._async_saver
        if saver is None or saver.group is None:
            return guard.requested_on_any_rank(self.args.device)
        # async_save with several ranks: the same all-reduce tells every rank, at the same step, that a background
        # save failed somewhere; all then raise it together (wait() agrees on the saver's own group).
        from ..runtime.distributed import any_rank

        requested, failed = any_rank([guard.requested, saver.failed], self.args.device)
        if failed:
            saver.wait()
        return bool(requested)

    def _stop_if_preempted(self, model: nn.Module, trial: Any, tr_loss: torch.Tensor) -> bool:
        """Called after each optimizer step: on a received SIGTERM/SIGINT, save a checkpoint and return True.

        The checkpoint is skipped when this step was just saved, or with ``save_strategy="no"`` (unless
        ``enable_jit_checkpoint``, upstream's preemption switch, asks for it). Sets
        ``self.preempted`` and ``control.should_training_stop``; the loop then ends without finishing the epoch.
        """
        saver = self._async_saver
        if saver is not None and saver.group is None:  # a failed background save surfaces at the next step
            saver.raise_if_failed()
        if self.control.should_training_stop or not self._preemption_requested():
            return False
        step = self.state.global_step
        name = self._preemption.signal_name or "a stop request"
        folder = self._checkpoints.checkpoint_dir(step)
        if self.args.save_strategy == "no" and not self.args.enable_jit_checkpoint:
            where = "no checkpoint saved (save_strategy='no')"
        else:
            if self._last_checkpoint is None or Path(self._last_checkpoint) != folder:
                folder = call_override(self, "_save_checkpoint", model, trial, tr_loss=tr_loss) or folder
                self.control = self.callback_handler.on_save(self.args, self.state, self.control)
            where = f"checkpoint saved in {folder}"
            if self._preemption_hint:
                where += f"; {self._preemption_hint}"
        self.preempted = True
        self.preempted_by = self._preemption.signal_name
        self.control.should_training_stop = True
        self._close_progress_bars()
        logger.warning("Training preempted by %s at step %d: %s", name, step, where)
        return True

    def _close_progress_bars(self) -> None:
        """End the progress bar's line before a message: a bar still drawn would have the message glued to it."""
        for callback in self.callback_handler.callbacks:
            bar = getattr(callback, "training_bar", None)
            if bar is not None:
                bar.close()
                callback.training_bar = None

    def _rotate_checkpoints_at_end(self) -> None:
        self._checkpoints.rotate(best_model_checkpoint=self.state.best_model_checkpoint)

    def _load_best_model(self) -> None:
        """Reload the weights of ``state.best_model_checkpoint`` (``load_best_model_at_end``)."""
        best = self.state.best_model_checkpoint
        if not best or not Path(best).is_dir():
            logger.warning("load_best_model_at_end: the best checkpoint %s is missing; keeping the last weights", best)
            return
        from ..checkpoint.weights import load_model_weights

        logger.info("Loading best model from %s (score: %s).", best, self.state.best_metric)
        load_model_weights(unwrap_model(self.model), best, strict=True)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save the model weights (``model.safetensors``, sharded above 5GB), the arguments and the processing class.

        A model with ``save_pretrained`` (a transformers model) is saved with it, config included.
        """
        output_dir = output_dir or self.args.output_dir
        try:  # a sharded model is gathered one tensor at a time while the writing rank writes it
            weights = self.backend.stream_state_dict(model_save=True) if self.backend.caps.sharded_state else None
        except WeightsNotGathered as err:  # ZeRO-3 without stage3_gather_16bit_weights_on_model_save (seed 001)
            logger.warning("%s", err)
            self.backend.save(Path(output_dir))  # the engine's checkpoint, written by every rank
            weights = False
        if not self.args.should_save:
            if weights:
                weights.drain()  # every rank takes part in each gather
            if self.args.push_to_hub and not _internal_call:  # every rank joins push_to_hub's save (collectives)
                self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)
            return
        from ..checkpoint.weights import save_model_weights

        os.makedirs(output_dir, exist_ok=True)
        if weights is not False:
            save_model_weights(unwrap_model(self.model), output_dir, safe_serialization=self.args.save_safetensors,
                               state_dict=weights)
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(output_dir)
        torch.save(self.args, os.path.join(output_dir, TRAINING_ARGS_NAME))
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)


def _is_exportable(callback: Any) -> bool:
    """An ExportableState: trainwell's mixin, or a class written against upstream's (same name, same contract)."""
    return any(base.__name__ == "ExportableState" for base in type(callback).__mro__) and callable(
        getattr(callback, "state", None))


def _rebuilt(callback: Any, entry: dict[str, Any]) -> Any:
    """``callback`` with the constructor ``args`` and ``attributes`` of a saved ``state()`` applied; returns it."""
    args, attributes = entry.get("args") or {}, entry.get("attributes") or {}
    if args:
        try:
            fresh = type(callback)(**args)
        except TypeError as err:
            logger.warning("Cannot rebuild %s from the saved arguments %s (%s); restoring its attributes only",
                           type(callback).__name__, args, err)
        else:
            try:
                vars(callback).update(vars(fresh))
            except TypeError:  # no __dict__ (slots): set the constructor's fields one by one
                for key, value in args.items():
                    setattr(callback, key, value)
    for key, value in attributes.items():
        setattr(callback, key, value)
    return callback


__all__ = ["TrainerCheckpointing", "TRAINER_STATE_NAME"]
