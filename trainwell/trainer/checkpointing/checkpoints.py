"""The Trainer's checkpoint part: what goes into ``checkpoint-<step>``, resume, preemption, best model, ``save_model``.

:class:`TrainerCheckpoints` is composed into :class:`trainwell.trainer.trainer.Trainer` (one attribute,
``trainer._tw_checkpoints``), built from the arguments and the backend; the Trainer's upstream methods
(``_save_checkpoint``, ``save_model``, ``_load_best_model``, ``_rotate_checkpoints``...) delegate to it. What changes
while training (state, model, optimizer, callbacks) it reads from the Trainer through :class:`CheckpointHost`, and
where upstream calls an overridable method (``_save_checkpoint``, ``push_to_hub``, ``_push_from_checkpoint``) it calls
the Trainer's, so that a subclass's override is reached (a checkpoint's files are written by the Trainer's ``_save``
and ``_save_optimizer_and_scheduler``, a resume loads through ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler`` and ``_load_rng_state``; what they do by default is :mod:`.save_load_defaults`).
The file work itself (atomic folders, validation, rotation, RNG) is :mod:`trainwell.checkpoint`."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ...backends.base import Backend
from ...utils.trainer_state import TrainerControl, TrainerState
from ...utils.model_utils import unwrap_model
from ...utils.overrides import call_override
from .checkpoint_store import StoreSync, local_best
from .output_dir_runs import claim_output_dir, require_output_dir, resume_advice, run_identity, warn_older_run
from .preemption_report import close_progress_bars, wait_for_preemption_save
from .resume_arguments import resolve_auto, warn_changed_arguments, warn_schedule_length_changed

if TYPE_CHECKING:  # imported where used: `from trainwell import Trainer` does not load them
    from ...args.fields import TrainingArguments
    from ...callbacks.events import CallbackHandler
    from ...checkpoint.async_save import AsyncSaver
    from ...checkpoint.lock import OutputDirLock
    from ...checkpoint.manager import CheckpointContents
    from ...checkpoint.preemption import PreemptionGuard
    from ...data.stream_state import StreamPosition
    from ...loops.look_ahead import BatchLookAhead
    from ...loops.loop_state import DataPosition, LoopState, Resumed, TrainPlan
    from ...loops.run import TrainingRun

logger = logging.getLogger("trainwell.trainer.trainer")

# With several processes the ranks agree on a stop only every this many optimizer steps (one all-reduce of a flag),
# so that the steps in between carry no extra collective nor device synchronisation.
PREEMPTION_SYNC_STEPS = 10


class CheckpointHost(Protocol):
    """What the checkpoint part reads from the Trainer (it changes while training) and the overridable Trainer
    methods it calls back."""

    args: TrainingArguments
    state: TrainerState
    control: TrainerControl
    model: nn.Module
    optimizer: Any
    lr_scheduler: Any
    processing_class: Any
    data_collator: Any
    callback_handler: CallbackHandler
    _train_batch_size: int
    _tw_run: TrainingRun | None  # the running (or last) train() call's run

    def store_flos(self) -> None: ...

    def is_local_process_zero(self) -> bool: ...

    def is_world_process_zero(self) -> bool: ...

    def _save_checkpoint(self, model: nn.Module, trial: Any, tr_loss: torch.Tensor | None = None) -> Path: ...

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None: ...

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None: ...

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: nn.Module | None = None) -> None: ...

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None: ...

    def _load_rng_state(self, checkpoint: str | None) -> None: ...

    def _push_from_checkpoint(self, checkpoint_folder: str | os.PathLike) -> None: ...

    def push_to_hub(self, commit_message: str | None = ..., blocking: bool = ..., **kwargs: Any) -> Any: ...


def _is_default(trainer: CheckpointHost, name: str) -> bool:
    """Whether ``trainer.<name>`` is trainwell's own method (not a subclass's override nor a patched attribute)."""
    if name in vars(trainer):
        return False
    return getattr(getattr(type(trainer), name, None), "__module__", None) == "trainwell.trainer.trainer"


class TrainerCheckpoints:
    """Checkpoints of one Trainer: the ``output_dir`` lock, resume, saves (synchronous or ``async_save``),
    preemption (SIGTERM/SIGINT -> a checkpoint and a clean stop), rotation, the best model and ``save_model``."""

    def __init__(self, trainer: CheckpointHost, *, args: TrainingArguments, backend: Backend) -> None:
        from ...checkpoint.manager import CheckpointManager

        self._trainer = trainer  # read for what changes while training; its overridable methods are called back
        self.args, self.backend = args, backend
        self.manager = CheckpointManager(require_output_dir(args.output_dir), save_total_limit=args.save_total_limit,
                                         rank=args.process_index, world_size=args.world_size,
                                         should_save=args.should_save,
                                         trust_pickles=bool(getattr(args, "trust_checkpoint_pickles", False)))
        self.last: Path | None = None  # the newest checkpoint the current train() call wrote
        self.resumed_from: Path | None = None  # the checkpoint the current train() call resumed from
        # How the preemption warning tells the user to continue (the CLI prints its own command instead: None).
        self.preemption_hint: str | None = "continue with train(resume_from_checkpoint=True)"
        self.resume_with_fallback = False
        self.output_dir_lock: OutputDirLock | None = None
        self.preempted, self.preemption_collective = False, False
        self.preempted_by: str | None = None  # the signal's name ("SIGTERM") when a signal stopped the run
        self.preemption_checkpoint: str | None = None  # the folder the preemption saved
        self.preemption: PreemptionGuard | None = None
        self.preemption_sync_steps = PREEMPTION_SYNC_STEPS
        self.async_saver: AsyncSaver | None = self._new_async_saver() if getattr(args, "async_save", False) else None
        self.store: StoreSync | None = StoreSync.from_args(args)  # checkpoint_store: the store's part

    @property
    def output_dir(self) -> str:
        """The arguments' ``output_dir`` (a str once they are built; None set afterwards raises naming the field)."""
        return require_output_dir(self.args.output_dir)

    def renewed(self, args: TrainingArguments) -> TrainerCheckpoints:
        """A fresh part of the same Trainer for new arguments (a hyper-parameter trial's own ``output_dir``)."""
        return TrainerCheckpoints(self._trainer, args=args, backend=self.backend)

    def _new_async_saver(self) -> AsyncSaver:
        """The saver of ``async_save=True``, with its own gloo group when several processes train (a collective)."""
        if not self.backend.caps.async_checkpoint:
            raise ValueError(
                f"async_save=True is not supported by the {type(self.backend).__name__} backend: its checkpoint is "
                "written by an engine (DeepSpeed's save_checkpoint, the ZeroRedundancyOptimizer state of "
                "sharded_ddp) synchronously, with collectives on the training process group, so it cannot run in "
                "a background thread; set async_save=False (one process, DDP and FSDP support it)")
        from ...checkpoint.async_save import AsyncSaver
        from ...runtime.distributed import is_dist

        if self.args.world_size > 1 and is_dist():
            from ...checkpoint.async_save import new_saver_group

            return AsyncSaver(group=new_saver_group(timeout_s=getattr(self.args, "ddp_timeout", None)))
        return AsyncSaver()

    def contents(self, *, loop: LoopState | None = None, tr_loss: torch.Tensor | None = None, stream: bool = False,
                 hooks: bool = False, look_ahead: BatchLookAhead | None = None,
                 data_stream: StreamPosition | None = None) -> CheckpointContents:
        """Everything resumable, as the checkpoint package expects it.

        ``stream``: a sharded model's weights are gathered one tensor at a time while they are written (a
        synchronous save); otherwise (an asynchronous save's snapshot) they are gathered whole now. ``hooks``: the
        files are written by the Trainer's ``_save`` and ``_save_optimizer_and_scheduler`` (a synchronous save).
        ``tr_loss`` is accepted for the callers' sake: the running loss is read from ``loop`` (so that an override
        calling ``super()._save_checkpoint(model, trial)`` without it still writes ``data_state.json``).
        ``look_ahead``: the loader's look-ahead, a part saved per rank (default, with ``loop``: the running run's);
        ``data_stream``: the position of the training stream, another per-rank part (the same default)."""
        from ...checkpoint.manager import CheckpointContents
        from ...data.stream_state import CHECKPOINT_NAME as STREAM_NAME
        from ...loops.look_ahead import CHECKPOINT_NAME

        trainer = self._trainer
        run = trainer._tw_run if look_ahead is None and loop is not None else None
        look_ahead = run.look_ahead if run is not None else look_ahead
        data_stream = getattr(run, "stream", None) if run is not None else data_stream
        rank_parts: dict[str, Any] = {CHECKPOINT_NAME: look_ahead} if look_ahead is not None else {}
        if data_stream is not None and data_stream.followed:
            rank_parts[STREAM_NAME] = data_stream
        # every rank's running loss is gathered (a collective: contents runs on every rank at save time)
        data_state = loop.data_state(trainer.state.global_step) if loop is not None else None
        sharded = self.backend.caps.sharded_state
        return CheckpointContents(
            write_model=self._call_save if hooks else None,
            write_optimizer_and_scheduler=(lambda folder: trainer._save_optimizer_and_scheduler(str(folder))
                                           ) if hooks else None,
            # A sharded backend saves and loads the optimizer state itself (collectively, in backend.save/load).
            model=unwrap_model(trainer.model), optimizer=None if sharded else trainer.optimizer,
            scheduler=trainer.lr_scheduler, extra=dict(self.backend.state_dicts()), trainer_state=trainer.state,
            args=self.args, data_state=data_state, processing_class=trainer.processing_class,
            rank_parts=rank_parts,
            save_only_model=self.args.save_only_model, safe_serialization=bool(self.args.save_safetensors),
            model_state_dict=None if not sharded else (self.backend.stream_state_dict(model_save=False) if stream
                                                         else self.backend.full_state_dict()))

    # ------------------------------------------------------------------------------------------------ resume
    def resolve_resume(self, resume_from_checkpoint: str | bool | None, *, trial: bool = False) -> Path | None:
        """The checkpoint folder to resume from (None to start fresh); ``trial``: a hyper-parameter search's trial
        (None never resumes from the store).

        Takes the ``output_dir`` lock first (world process zero; released by :meth:`release_output_dir`), then
        removes the temporary folders of interrupted trainwell saves. Foreign checkpoints are left alone."""
        from ...checkpoint.layout import cleanup_incomplete

        if resume_from_checkpoint is None and self.args.resume_from_checkpoint:
            resume_from_checkpoint = self.args.resume_from_checkpoint
        recovered: list[Path] = []
        try:
            from .run_lock import lock_output_dir, warn_foreign_checkpoints  # at train(): importing stays lean

            # a store failing after the folder's lock was taken: that lock released there, the store's below
            self.output_dir_lock = lock_output_dir(self.args, self.store, self.output_dir_lock)
            if self.args.should_save:
                removed = cleanup_incomplete(self.output_dir, at_startup=True, recovered=recovered)
                if removed:
                    logger.warning("Removed incomplete checkpoint folders left by an interrupted save or DeepSpeed "
                                   "conversion: %s", [str(p) for p in removed])
            if self.store is not None:  # None on an empty output_dir may mean the store's newest; downloads
                resume_from_checkpoint = self.store.resolve(self.args, self.output_dir, resume_from_checkpoint,
                                                            trial=trial)
            self._wait_for_cleanup()
            asked = resume_from_checkpoint
            resume_from_checkpoint = resolve_auto(resume_from_checkpoint, self.args.output_dir)
            self.resume_with_fallback = resume_from_checkpoint is True
            folder = self._resolve_folder(resume_from_checkpoint)
            # a fresh run supersedes a finished run's checkpoints (one promoted now is the relaunched job's own)
            promoted = self._on_every_rank(recovered)
            claim_output_dir(self.args, folder, recovered=promoted)
            if not isinstance(resume_from_checkpoint, bool):  # a path: is it the newest run's?
                warn_older_run(self.args, folder, recovered=promoted)
            self.manager.run_id = run_identity(self.args, folder)
            if self.store is not None:  # world process zero (the lock held): warn, delete or publish
                self.store.start(self.args, self.output_dir, folder, self.manager.run_id)
        except BaseException:
            self.release_output_dir()
            raise
        if resume_from_checkpoint is True and folder is not None:  # the one line a resume prints ('auto' too)
            source = self.store.source_of(folder) if self.store is not None else None
            logger.warning("resume_from_checkpoint=%s: resuming from %s, the newest checkpoint of %s (%s; an older "
                           "one is used if it is damaged)", "'auto'" if asked != resume_from_checkpoint else "True",
                           folder, self.args.output_dir, f"downloaded from {source}" if source else "local")
        warn_foreign_checkpoints(self.args, self.output_dir, folder)
        self.last, self.resumed_from = None, folder
        return folder

    def _resolve_folder(self, resume_from_checkpoint: str | bool | None) -> Path | None:
        """The manager's answer; with a store, True finding nothing says that the store holds none either."""
        try:
            return self.manager.resolve_resume(resume_from_checkpoint)
        except ValueError as err:
            if self.store is None or resume_from_checkpoint is not True:
                raise
            raise ValueError(f"No valid checkpoint found in output directory ({self.output_dir}) nor in "
                             f"checkpoint_store {self.store.store.url} (resume_from_checkpoint=True); train from "
                             "scratch, pass the path of a checkpoint folder, or check checkpoint_store (a run that "
                             "saved there used this URL?)") from err

    def of_this_run(self) -> Path | None:
        """The newest checkpoint the current ``train()`` call wrote, else the one it resumed from; never a
        checkpoint another run left in ``output_dir``."""
        return self.last or self.resumed_from

    def _on_every_rank(self, names: list[Path]) -> set[str]:
        """The folder names the saving ranks report (every rank decides alike from them)."""
        mine = {p.name for p in names}
        if self.args.world_size > 1:
            from ...runtime.distributed import all_gather_object, is_dist

            if is_dist():
                return set().union(*all_gather_object(mine))
        return mine

    def _wait_for_cleanup(self) -> None:
        """Every rank waits for the saving rank's clean-up: it may have promoted an interrupted save's folder
        into place (the newest checkpoint), which every rank must see when it decides where to resume."""
        if self.args.world_size > 1:
            from ...runtime.distributed import barrier, is_dist

            if is_dist():
                barrier()

    def release_output_dir(self) -> None:
        """Release the ``output_dir`` lock taken by :meth:`resolve_resume` (a no-op when not held).

        A background save still in flight (``train()`` raised) is waited for first: it writes into ``output_dir``."""
        if self.async_saver is not None:
            self.async_saver.join()
        if self.store is not None:
            self.store.close()
        lock, self.output_dir_lock = self.output_dir_lock, None
        if lock is not None:
            lock.release()

    def load(self, folder: Path, plan: TrainPlan, look_ahead: BatchLookAhead | None = None,
             data_stream: StreamPosition | None = None) -> Resumed:
        """Restore model, optimizer, scheduler, scaler, RNG, the run's ``look_ahead`` and its stream's saved position
        (``data_stream``, applied when the epoch resumes) from ``folder``; returns the
        data position and the TrainerState (with this run's plan) to adopt, and the callbacks' states restored."""
        from ...backends.optimizer_state_forms import check_resumable
        from ...loops.loop_state import Resumed

        # another backend's optimizer state is refused now, on every rank, before anything is loaded
        check_resumable(folder, deepspeed=bool(getattr(self.args, "deepspeed", None)), world_size=self.args.world_size)
        contents = self.contents(look_ahead=look_ahead, data_stream=data_stream)
        trainer = self._trainer
        # upstream's overridable loaders, called where upstream calls them (into the temporary staging of the load)
        contents.load_model = lambda path: trainer._load_from_checkpoint(str(path))
        contents.load_optimizer_and_scheduler = lambda path: trainer._load_optimizer_and_scheduler(str(path))
        contents.load_rng = lambda path: trainer._load_rng_state(str(path))
        # Every rank validates, agrees and loads together (trainwell's files, then the engine's); see
        # trainwell.checkpoint.agreement.
        options = dict[str, Any](load_trainer_state=TrainerState.load_from_json, engine_load=self.backend.load,
                                 engine_check=self.backend.check_checkpoint, context=self.backend.gathered_parameters)
        if self.resume_with_fallback:
            folder, result = self.manager.load_latest_valid(contents, **options)
        else:
            result = self.manager.load_agreed(folder, contents, **options)
        logger.info("Resuming training from %s", folder)
        state = self._loaded_state(result["trainer_state"], plan)
        step = (state or self._trainer.state).global_step
        position = self._data_position(result["data_state"], folder, plan, step)
        return Resumed(position, state)

    def _data_position(self, data_state: dict[str, Any] | None, folder: Path, plan: TrainPlan,
                       step: int) -> DataPosition:
        """Where the data stream stood in the checkpoint of ``step`` (derived from the step when it cannot be
        restored)."""
        from ...loops.loop_state import DataPosition
        from .resume_shape import data_shape_changed

        trainer = self._trainer
        if data_state is not None and data_shape_changed(self.args, trainer._train_batch_size, trainer.state.global_step,
                                                         data_state, folder, plan):
            data_state = {k: v for k, v in data_state.items() if k not in ("epoch", "batches_in_epoch")}
        if data_state is None or "epoch" not in data_state:
            # written by another tool, or for another epoch shape: derive the position from the step (as upstream)
            per_epoch = plan.updates_per_epoch or 1
            data_state = {**(data_state or {}), "epoch": step // per_epoch,
                          "batches_in_epoch": (step % per_epoch) * self.args.gradient_accumulation_steps}
        if "last_logged_step" not in data_state:
            # no loss accumulators (another tool's checkpoint): the first logging window starts here, as upstream's
            data_state["last_logged_step"] = step
        position = DataPosition.from_dict(data_state)
        if step >= plan.max_steps:
            # A finished run's final checkpoint (a requeue after the end): no step past max_steps (upstream trains one
            # more when the last step falls mid-epoch). An empty epoch range ends the loop before its first step.
            logger.info("Training is already complete: the checkpoint is at global_step %d and max_steps is %d; no "
                        "further step is trained.", step, plan.max_steps)
            position.epoch, position.batches_in_epoch = plan.num_epochs, 0
        return position

    def _loaded_state(self, loaded: TrainerState | None, plan: TrainPlan) -> TrainerState | None:
        """The loaded TrainerState with this run's plan (the run adopts it); the callbacks' states restored."""
        if loaded is None:
            return None
        trainer = self._trainer
        warn_changed_arguments(self.args, loaded)
        warn_schedule_length_changed(self.args, loaded, plan.max_steps)
        loaded.is_local_process_zero = trainer.is_local_process_zero()
        loaded.is_world_process_zero = trainer.is_world_process_zero()
        loaded.compute_steps(self.args, plan.max_steps)
        loaded.max_steps = plan.max_steps
        loaded.num_train_epochs = plan.num_epochs
        loaded.train_batch_size = trainer._train_batch_size
        if self.store is not None:  # downloaded from the store: its best checkpoint was downloaded next to it
            loaded.best_model_checkpoint = local_best(loaded.best_model_checkpoint, self.output_dir)
        if self.args.restore_callback_states_from_checkpoint and loaded.stateful_callbacks:
            from .callback_states import restore_callback_states

            trainer.control = restore_callback_states(trainer.callback_handler.callbacks, trainer.control,
                                                      loaded.stateful_callbacks)
        return loaded

    # -------------------------------------------------------------------------------------------------- save
    def save(self, model: nn.Module, trial: Any, *, tr_loss: torch.Tensor | None, loop: LoopState | None) -> Path:
        """Write ``checkpoint-<global_step>`` atomically, then rotate old ones.

        A second Ctrl-C during the save (a stop was already requested) quits at once, saying which checkpoint is
        left to resume from.
        """
        from ...checkpoint.layout import list_complete_checkpoints

        try:
            return self._write(tr_loss, loop)
        except KeyboardInterrupt:
            guard = self.preemption
            if guard is None or not guard.requested:
                raise
            close_progress_bars(self._trainer.callback_handler)
            newest = list_complete_checkpoints(self.output_dir)
            raise KeyboardInterrupt(
                f"second {guard.signal_name or 'interrupt'} during the save of step {self._trainer.state.global_step}:"
                f" quitting without that checkpoint; the newest valid one is "
                f"{newest[-1] if newest else 'none (nothing to resume from)'}") from None

    def _write(self, tr_loss: torch.Tensor | None, loop: LoopState | None) -> Path:
        from .callback_states import export_callback_states

        trainer = self._trainer
        state, step = trainer.state, trainer.state.global_step
        folder = self.manager.checkpoint_dir(step)
        if state.best_global_step == step and self.args.metric_for_best_model:
            state.best_model_checkpoint = str(folder)
        trainer.store_flos()
        state.stateful_callbacks = export_callback_states(trainer.callback_handler.callbacks, trainer.control)
        self.manager.engine_needs_shared_folder = self.backend.caps.engine_needs_shared_folder
        if self.async_saver is not None and not self._save_overridden():  # written and rotated in the background
            best = state.best_model_checkpoint

            def after(saved: Path) -> None:  # in the saver's thread, once the checkpoint is committed
                self._rotate_and_publish(saved, best)
            folder = self.async_saver.save(self.manager, step, self.contents(loop=loop, tr_loss=tr_loss),
                                           after=after, engine_snapshot=self.backend.async_engine_snapshot)
            self.last = folder
            if self.args.push_to_hub:  # the push reads the checkpoint: wait until it is committed
                self.async_saver.wait()
                trainer._push_from_checkpoint(folder)
            return folder
        if self.async_saver is not None:  # an override of _save reads the live model: written now, in this thread
            self.async_saver.wait()
        # The backend's engine files go into the temporary folder before the marker (one commit for every rank);
        # the Trainer's _save and _save_optimizer_and_scheduler write into it too (whatever layout they choose).
        folder = self.manager.save(step, self.contents(loop=loop, tr_loss=tr_loss, stream=True, hooks=True),
                                   engine_save=self.backend.save)
        self.last = folder
        trainer._push_from_checkpoint(folder)
        self._rotate_and_publish(folder, state.best_model_checkpoint)
        return folder

    def _rotate_and_publish(self, folder: Path, best: str | None) -> None:
        """Rotate ``output_dir``; with ``checkpoint_store``, upload ``folder`` first (the local rotation then runs
        after the upload, in the uploader's thread: a checkpoint is never deleted while it is read for its upload)."""
        def rotate() -> None:
            uploading = self.store.uploading() if self.store is not None else ()
            self.manager.rotate(best_model_checkpoint=best, keep=folder, also_keep=uploading)

        if self.store is None or not self._publish(folder, best, rotate):
            rotate()

    def _publish(self, folder: Path, best: str | None, rotate: Any) -> bool:
        from ...checkpoint.nodes import node_index, saving_nodes

        assert self.store is not None
        nodes = saving_nodes(self.manager.output_dir)
        return self.store.publish(folder, best, run=self.manager.run_id, saves=self.manager.should_save,
                                  node=node_index(self.args.process_index) if nodes > 1 else 0, nodes=nodes,
                                  then=rotate)

    def _save_overridden(self) -> bool:
        """Whether a subclass overrides ``_save`` or ``_save_optimizer_and_scheduler`` (read the live state)."""
        return not (_is_default(self._trainer, "_save") and _is_default(self._trainer, "_save_optimizer_and_scheduler"))

    def _call_save(self, folder: Path, state_dict: Any) -> None:
        """The Trainer's ``_save`` into a checkpoint's temporary folder; an override gets a plain state dict (weights
        streamed from a sharded model are gathered whole for it)."""
        if state_dict is not None and not isinstance(state_dict, dict) and not _is_default(self._trainer, "_save"):
            state_dict = state_dict.materialize()
        self._trainer._save(str(folder), state_dict=state_dict)

    def wait(self) -> None:
        """Wait for an asynchronous save in flight; raise its failure (a no-op without ``async_save``)."""
        if self.async_saver is not None:
            self.async_saver.wait()
        if self.store is not None:  # checkpoint_store: the last upload is published before train() returns
            self.store.wait()

    def rotate(self, output_dir: str | os.PathLike | None = None, *, use_mtime: bool = False) -> list[Path]:
        """Delete the oldest of trainwell's checkpoints in ``output_dir`` (default: ``args.output_dir``) beyond
        ``save_total_limit``, never the best one nor a folder trainwell did not write. ``use_mtime`` is accepted
        for upstream's signature: the order is always the step's (a file's time can move backwards on a copy)."""
        from ...checkpoint.manager import CheckpointManager

        manager = self.manager
        if output_dir is not None and Path(output_dir).resolve() != Path(self.output_dir).resolve():
            manager = CheckpointManager(output_dir, save_total_limit=self.args.save_total_limit,
                                        rank=self.args.process_index, world_size=self.args.world_size,
                                        should_save=self.args.should_save)
        mine = self.of_this_run() if manager is self.manager else None  # never this run's newest checkpoint
        return manager.rotate(best_model_checkpoint=self._trainer.state.best_model_checkpoint, keep=mine)

    def sorted_checkpoints(self, output_dir: str | os.PathLike | None = None, prefix: str = "checkpoint", *,
                           use_mtime: bool = False) -> list[str]:
        """trainwell's complete checkpoints named ``<prefix>-<step>`` in ``output_dir``, oldest first (by
        modification time with ``use_mtime``); as upstream, the best checkpoint is moved towards the end so that a
        rotation taking from the front keeps it."""
        from ...checkpoint.layout import list_complete_checkpoints

        found = [p for p in list_complete_checkpoints(output_dir or self.output_dir, current_run=self.manager.run_id)
                 if p.name.startswith(f"{prefix}-")]
        if use_mtime:
            found.sort(key=lambda p: p.stat().st_mtime)
        names = [str(p) for p in found]
        best = self._trainer.state.best_model_checkpoint
        if best is not None and str(Path(best)) in names and names.index(str(Path(best))) < len(names) - 2:
            names.remove(str(Path(best)))
            names.insert(len(names) - 1, str(Path(best)))  # second to last, as upstream
        return names

    # ------------------------------------------------------------------------------------------------ preemption
    @contextmanager
    def preemption_scope(self) -> Iterator[PreemptionGuard]:
        """Turn SIGTERM/SIGINT into a graceful stop for the duration of ``train()`` (see :meth:`stop_if_preempted`)."""
        self.preempted = False
        self.preempted_by = self.preemption_checkpoint = None
        from ...checkpoint.preemption import PreemptionGuard

        self.preemption_collective = self.args.world_size > 1
        with PreemptionGuard() as guard:
            self.preemption = guard
            try:
                yield guard
            finally:
                self.preemption = None

    def _preemption_requested(self) -> bool:
        """Whether a stop was asked for; cheap in one process (a flag read), a collective every N steps otherwise."""
        guard = self.preemption
        if guard is None:
            return False
        if not self.preemption_collective:
            return guard.requested
        if self._trainer.state.global_step % max(1, self.preemption_sync_steps):
            return False
        saver = self.async_saver
        if saver is None or saver.group is None:
            return guard.requested_on_any_rank(self.args.device)
        # async_save with several ranks: the same all-reduce tells every rank, at the same step, that a background
        # save failed somewhere; all then raise it together (wait() agrees on the saver's own group).
        from ...runtime.distributed import any_rank

        requested, failed = any_rank([guard.requested, saver.failed], self.args.device)
        if failed:
            saver.wait()
        return bool(requested)

    def stop_if_preempted(self, model: nn.Module, trial: Any, tr_loss: torch.Tensor) -> bool:
        """Called after each optimizer step: on a received SIGTERM/SIGINT, save a checkpoint and return True.

        The checkpoint is skipped when this step was just saved, or with ``save_strategy="no"`` (unless
        ``enable_jit_checkpoint``, upstream's preemption switch, asks for it). Sets
        ``preempted`` and ``control.should_training_stop``; the loop then ends without finishing the epoch.
        """
        saver = self.async_saver
        if saver is not None and saver.group is None:  # a failed background save surfaces at the next step
            saver.raise_if_failed()
        guard = self.preemption
        if guard is not None and not guard.requested and not self.preemption_collective:
            return False  # one process and no signal (every step): _preemption_requested's answer, read inline
        if self._trainer.control.should_training_stop or guard is None or not self._preemption_requested():
            return False
        trainer = self._trainer
        step = trainer.state.global_step
        name = guard.signal_name or "a stop request"
        folder = self.manager.checkpoint_dir(step)
        if self.args.save_strategy == "no" and not self.args.enable_jit_checkpoint:
            where = "no checkpoint saved (save_strategy='no')"
        else:
            if self.last is None or Path(self.last) != folder:
                folder = call_override(trainer, "_save_checkpoint", model, trial, tr_loss=tr_loss) or folder
                trainer.control = trainer.callback_handler.on_save(self.args, trainer.state, trainer.control)
            failed = saver is not None and saver.busy and not wait_for_preemption_save(
                saver, trainer.callback_handler, f"Training preempted by {name} at step {step}", folder)
            where = f"the background save of {folder} failed (the error follows)" if failed else \
                f"checkpoint saved in {folder}"
            if self.preemption_hint and not failed:
                where += f"; {resume_advice(self.output_dir, Path(folder))}"
        self.preempted = True
        self.preempted_by = guard.signal_name
        self.preemption_checkpoint = None if where.startswith(("no checkpoint", "the background")) else str(folder)
        trainer.control.should_training_stop = True
        close_progress_bars(self._trainer.callback_handler)
        logger.warning("Training preempted by %s at step %d: %s", name, step, where)
        return True


__all__ = ["CheckpointHost", "PREEMPTION_SYNC_STEPS", "TrainerCheckpoints"]
