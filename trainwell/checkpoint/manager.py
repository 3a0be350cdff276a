"""CheckpointManager: save, rotate, find and restore ``output_dir/checkpoint-<step>`` folders.

A checkpoint is a :class:`CheckpointContents` (model, optimizer, scheduler, any objects with
``state_dict()``/``load_state_dict()``, trainer state, arguments, data position, tokenizer). Saving goes
through the commit protocol of :mod:`trainwell.checkpoint.commit` (one transaction for every rank and the
backend's engine files: temporary folder, every rank's files, agreement, marker with sizes and checksums,
rename), so a crash never leaves a folder that looks complete. Loading validates every file (sizes, checksums,
pickle allow-list) and reads everything into memory first, and only then applies it, so a damaged checkpoint
raises :class:`~trainwell.checkpoint.layout.CheckpointError` without touching the model;
:meth:`CheckpointManager.load_latest_valid` falls back to the previous checkpoint, with every rank together
(:mod:`trainwell.checkpoint.agreement`).

Several processes (``world_size > 1``): the process(es) with ``should_save=True`` (rank 0, or the local main
process of each node with ``save_on_each_node``) write the shared files; every rank writes its own
``rng_state_<rank>.pth`` into the same temporary folder, before the marker that lists them all. Backends whose
weights are sharded across ranks pass the gathered full weights as ``model_state_dict``.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..utils.secrets import without_secrets
from ..utils.checkpoint_names import PREFIX_CHECKPOINT_DIR
from . import layout
from .layout import CheckpointError
from ..utils.trainer_state import trainer_state_problems
from .agreement import verify_share, candidates, load_agreed
from .commit import commit_checkpoint
from .digest import torch_save, write_bytes
from .nodes import writes_here
from .ranks import Ranks
from .rng import rng_file_name, capture_rng_state, read_rng_file, rng_file_to_restore, restore_rng_state
from .safe_pickle import load_error
from .weights import save_model_weights, find_weights_file, match_state_dict, read_weights

if TYPE_CHECKING:  # pragma: no cover
    from torch import nn

logger = logging.getLogger(__name__)


@dataclass
class CheckpointContents:
    """What goes into (and comes out of) one checkpoint; every field but ``model`` is optional.

    - ``model``: the user's model, unwrapped (not the DDP/FSDP wrapper).
    - ``optimizer`` / ``scheduler``: saved as ``optimizer.pt`` / ``scheduler.pt`` (``torch.save`` of their state dicts).
    - ``extra``: ``{name: object with state_dict()/load_state_dict()}`` (e.g. ``"scaler"``), each saved as
      ``<name>.pt``. Their state dicts must hold only tensors, numbers, strings and containers of them
      (files are read back with ``torch.load(weights_only=True)``).
    - ``trainer_state``: object with ``save_to_json(path)`` -> ``trainer_state.json``.
    - ``args``: object with ``to_json_string()`` -> ``training_args.json``; also pickled to ``training_args.bin``.
    - ``data_state``: JSON-serialisable dict (epoch, batches consumed, sampler seed) -> ``data_state.json``.
    - ``processing_class``: tokenizer/processor; its ``save_pretrained(folder)`` is called when it has one.
    - ``save_only_model``: write weights (and state/args) only: no optimizer, scheduler, extras or RNG.
    - ``model_state_dict``: weights to write instead of ``model.state_dict()`` (gathered by a sharded backend).
    - ``rank_parts``: ``{name: object with state_dict()/load_state_dict()}`` whose state is this rank's own (e.g. the
      random states the training loader's look-ahead kept): each state dict is saved inside this rank's RNG file
      under ``name`` (a key upstream's reader ignores; an empty state dict is not written, nor any with
      ``save_only_model``), and loaded back by :meth:`CheckpointManager.load` from the RNG file the rank restores
      its random streams from (another rank's when the number of processes changed, as the streams); an empty dict
      when that file has none.
    """

    model: "nn.Module"
    optimizer: Any = None
    scheduler: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    trainer_state: Any = None
    args: Any = None
    data_state: dict[str, Any] | None = None
    processing_class: Any = None
    save_only_model: bool = False
    safe_serialization: bool = True
    model_state_dict: dict[str, "torch.Tensor"] | None = None
    max_shard_size: int | str = "5GB"
    rank_parts: dict[str, Any] = field(default_factory=dict)
    # The Trainer's overridable methods, called where upstream calls them (None: the manager does the work itself).
    # Saving: ``write_model(folder, state_dict)`` writes the weights, config, processing class and
    # ``training_args.bin`` (the Trainer's ``_save``); ``write_optimizer_and_scheduler(folder)`` the optimizer and
    # scheduler files (``_save_optimizer_and_scheduler``). Both write into the temporary folder the commit
    # checksums and renames, whatever layout they choose.
    write_model: Callable[[Path, Any], None] | None = None
    write_optimizer_and_scheduler: Callable[[Path], None] | None = None
    # Loading: ``load_model(folder)`` loads the weights (``_load_from_checkpoint``), ``load_optimizer_and_scheduler``
    # (``_load_optimizer_and_scheduler``) and ``load_rng(folder)`` (``_load_rng_state``); the defaults apply what
    # :meth:`CheckpointManager.load` staged (see :meth:`CheckpointManager.apply_optimizer_and_scheduler`).
    load_model: Callable[[Path], None] | None = None
    load_optimizer_and_scheduler: Callable[[Path], None] | None = None
    load_rng: Callable[[Path], None] | None = None


def with_rank_parts(rng_state: dict[str, Any], parts: dict[str, Any]) -> dict[str, Any]:
    """``rng_state`` (this rank's RNG file) with the state dict of each of ``parts`` under its name (those with an
    empty state dict left out); a name that is a key of the random states is refused."""
    saved = dict(rng_state)
    for name, obj in parts.items():
        if name in rng_state:
            raise ValueError(f"per-rank checkpoint part {name!r}: the RNG file already has that key")
        state = obj.state_dict()
        if state:
            saved[name] = state
    return saved


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save``, hashed as it writes (the checksum goes into the marker; the commit fsyncs it)."""
    torch_save(obj, path)


def _write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def _torch_read(path: Path, what: str, trusted: bool = False) -> Any:
    if not path.is_file():
        raise CheckpointError(f"{path}: {what} file is missing from the checkpoint")
    try:
        return torch.load(path, map_location="cpu", weights_only=not trusted)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError) as err:
        raise load_error(path, what, err) from err


def _check_optimizer_state(path: Path, saved: Any, optimizer: Any) -> Any:
    """``saved``, checked to fit ``optimizer`` (its parameter groups, their number and sizes); raises before anything
    is applied when it does not."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if groups is None:
        raise CheckpointError(f"{path}: not an optimizer state dict (no 'param_groups')")
    current = optimizer.state_dict()["param_groups"]
    saved_sizes = [len(g["params"]) for g in groups]
    current_sizes = [len(g["params"]) for g in current]
    if saved_sizes != current_sizes:
        raise CheckpointError(
            f"{path}: optimizer parameter groups have sizes {saved_sizes} in the checkpoint but {current_sizes} "
            "now; build the optimizer for the same model and parameter groups, or resume without the optimizer"
        )
    return saved


def write_optimizer_and_scheduler(folder: Path, optimizer: Any, scheduler: Any) -> None:
    """``optimizer.pt`` and ``scheduler.pt`` (each when given), hashed as written (upstream's file names)."""
    if optimizer is not None:
        _torch_save(optimizer.state_dict(), folder / layout.OPTIMIZER_NAME)
    if scheduler is not None:
        _torch_save(scheduler.state_dict(), folder / layout.SCHEDULER_NAME)


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: cannot read {what} ({err}); the file is truncated or corrupt") from err


class CheckpointManager:
    """Saves, rotates, discovers and restores the checkpoints of one ``output_dir``.

    ``save_total_limit``: keep at most that many complete checkpoints (the newest and the best are never
    deleted). ``rank``/``world_size``: this process's place (selects its RNG file). ``should_save``: whether this
    process writes the checkpoint (rank 0; the local main process of each node with ``save_on_each_node``).
    ``trust_pickles``: load pickled files without the allow-list check (``trust_checkpoint_pickles``).
    """

    def __init__(self, output_dir: str | os.PathLike, *, save_total_limit: int | None = None, rank: int = 0,
                 world_size: int = 1, should_save: bool = True, trust_pickles: bool = False) -> None:
        self.output_dir = Path(output_dir)
        self.trust_pickles = trust_pickles
        self.save_total_limit = save_total_limit
        self.rank = rank
        self.world_size = world_size
        self.should_save = should_save
        # set by the trainer from its backend: the engine's files are complete only in a folder every node sees
        self.engine_needs_shared_folder = False
        # the identity of the training run saving here (set by the trainer): recorded in each marker, and this run's
        # checkpoints count as newer than any other run's in rotation and discovery (layout.order_by_run)
        self.run_id: str | None = None
        self._staged: tuple[Path, dict[str, Any]] | None = None  # (folder, states) while load() applies them

    def checkpoint_dir(self, step: int) -> Path:
        """``output_dir/checkpoint-<step>``."""
        return self.output_dir / f"{PREFIX_CHECKPOINT_DIR}-{step}"

    @property
    def rng_file(self) -> str:
        """This rank's RNG file name."""
        return rng_file_name(self.rank, self.world_size)

    # ------------------------------------------------------------------------------------------ save

    def save(self, step: int, contents: CheckpointContents, *,
             engine_save: Callable[[Path], None] | None = None, rng_state: dict[str, Any] | None = None,
             group: Any = None) -> Path:
        """Write checkpoint ``step`` with the commit protocol of :mod:`trainwell.checkpoint.commit`; returns its folder.

        A collective when ``world_size > 1``: every rank must call it. ``engine_save(tmp)`` (the backend's
        ``save``) writes the engine's own files into the temporary folder before the marker. ``rng_state``: the
        RNG states to write (captured earlier by an asynchronous save; default: captured now). ``group``: the
        process group of the commit's collectives (default: the training one; an asynchronous save passes its own).
        Call :meth:`rotate` afterwards to apply ``save_total_limit``.
        """
        def write_files(tmp: Path) -> None:
            try:
                if self.should_save:
                    self._write_contents(tmp, contents)
            finally:  # weights streamed from a sharded model: every rank takes part in every gather, even on error
                drain = getattr(contents.model_state_dict, "drain", None)
                if drain is not None:
                    drain()
            if not contents.save_only_model:
                state = rng_state if rng_state is not None else capture_rng_state()
                _torch_save(with_rank_parts(state, contents.rank_parts), tmp / self.rng_file)

        ranks = Ranks(self.rank, self.world_size, group=group)
        # several nodes: one shared folder is written once (by rank 0), one disk per node by each node's first rank
        self.should_save = writes_here(self.output_dir, ranks, self.should_save,
                                       engine_needs_shared_folder=self.engine_needs_shared_folder)
        return commit_checkpoint(self.checkpoint_dir(step), step, ranks, should_save=self.should_save,
                                 write_files=write_files, engine_save=engine_save, run=self.run_id)

    @property
    def ranks(self) -> "Ranks":
        """The processes taking part in saves and resumes."""
        return Ranks(self.rank, self.world_size)

    def _write_contents(self, folder: Path, c: CheckpointContents) -> None:
        """The files of the saving rank (everything but the per-rank RNG files and the engine's files)."""
        if c.write_model is not None:
            c.write_model(folder, c.model_state_dict)
        else:
            save_model_weights(c.model, folder, safe_serialization=c.safe_serialization,
                               max_shard_size=c.max_shard_size, state_dict=c.model_state_dict)
        if not c.save_only_model:
            if c.write_optimizer_and_scheduler is not None:
                c.write_optimizer_and_scheduler(folder)
            else:
                write_optimizer_and_scheduler(folder, c.optimizer, c.scheduler)
            for name, obj in c.extra.items():
                _torch_save(obj.state_dict(), folder / f"{name}.pt")
        if c.trainer_state is not None:
            c.trainer_state.save_to_json(str(folder / layout.TRAINER_STATE_NAME))
        if c.args is not None:
            _write_text(folder / layout.TRAINING_ARGS_JSON_NAME, c.args.to_json_string())
            if c.write_model is None or not (folder / layout.TRAINING_ARGS_NAME).is_file():  # (_save wrote it)
                _torch_save(without_secrets(c.args), folder / layout.TRAINING_ARGS_NAME)
        if c.data_state is not None:
            _write_text(folder / layout.DATA_STATE_NAME, json.dumps(c.data_state, indent=2))
        if c.write_model is None and c.processing_class is not None and hasattr(c.processing_class, "save_pretrained"):
            c.processing_class.save_pretrained(str(folder))

    # -------------------------------------------------------------------------------------- rotation

    def rotate(self, best_model_checkpoint: str | os.PathLike | None = None, *,
               keep: str | os.PathLike | None = None, also_keep: tuple[Path, ...] = ()) -> list[Path]:
        """Delete the oldest complete checkpoints beyond ``save_total_limit``; returns the deleted folders.

        The newest checkpoint, ``best_model_checkpoint`` and ``keep`` (the checkpoint just saved: after a resume from
        an older checkpoint it is not the newest) are always kept, so a limit of 1 with a best checkpoint that is not
        the newest keeps 2. Oldest means every other run's checkpoints before this run's (``run_id``), whatever
        their steps. Does nothing without a limit or when ``should_save`` is False.
        """
        if not self.should_save or not self.save_total_limit or self.save_total_limit <= 0:
            return []
        found = layout.list_complete_checkpoints(self.output_dir, current_run=self.run_id)
        if not found:
            return []
        protected = {found[-1].resolve()}
        for kept in (best_model_checkpoint, keep, *also_keep):  # also_keep: checkpoints still being uploaded
            if kept is not None:
                protected.add(Path(kept).resolve())
        keep_count = max(self.save_total_limit, sum(1 for p in found if p.resolve() in protected))
        deletable = [p for p in found if p.resolve() not in protected]
        doomed = deletable[: max(0, len(found) - keep_count)]
        for folder in doomed:
            logger.info("deleting older checkpoint %s (save_total_limit=%s)", folder, self.save_total_limit)
            layout.delete_checkpoint(folder)
        return doomed

    # ------------------------------------------------------------------------------------- discovery

    def resolve_resume(self, resume_from_checkpoint: bool | str | os.PathLike | None) -> Path | None:
        """The folder to resume from: None/False -> None; True -> newest checkpoint; a path -> that folder.

        Foreign checkpoints (``checkpoint-<step>`` folders without trainwell's marker, e.g. the upstream Trainer's)
        count: they are validated when loaded. Raises ValueError when True finds no checkpoint, or when the path
        does not exist or is an ``output_dir`` rather than a checkpoint folder.
        """
        if resume_from_checkpoint is None or resume_from_checkpoint is False:
            return None
        if resume_from_checkpoint is True:
            found = layout.list_resumable_checkpoints(self.output_dir)
            if not found:
                # upstream's first sentence, which scripts and tests match; then the way on
                raise ValueError(f"No valid checkpoint found in output directory ({self.output_dir}) "
                                 "(resume_from_checkpoint=True); train from scratch or pass the path of a checkpoint "
                                 "folder")
            return found[-1]
        folder = Path(resume_from_checkpoint)
        if not folder.is_dir():
            raise ValueError(f"Can't find a valid checkpoint at {resume_from_checkpoint} "
                             f"(resume_from_checkpoint={str(resume_from_checkpoint)!r}: "
                             f"{_missing_checkpoint_hint(folder)})")
        if not layout.is_complete(folder):
            inside = layout.list_resumable_checkpoints(folder)
            if inside:
                raise ValueError(f"resume_from_checkpoint={str(resume_from_checkpoint)!r} is an output_dir, not a "
                                 f"checkpoint folder: pass {inside[-1]} or resume_from_checkpoint=True")
            logger.info("%s has no %s marker: a checkpoint written by another tool (e.g. the upstream Trainer); "
                        "it is validated while loading", folder, layout.COMPLETE_MARKER)
        return folder

    # ------------------------------------------------------------------------------------------ load

    def verify(self, folder: str | os.PathLike) -> None:
        """Check every file of ``folder`` against its marker (sizes, checksums) and the pickle allow-list."""
        verify_share(Path(folder), share=(0, 1), own=[], trust_pickles=self.trust_pickles)

    def _read_all(self, folder: Path, c: CheckpointContents, load_optimizer: bool, verify: bool) -> dict[str, Any]:
        """Read and validate every file needed for ``c`` into memory; touches nothing."""
        if verify:
            self.verify(folder)  # a foreign folder has no file list: loading it validates it
        staged: dict[str, Any] = {"trainer_state_dict": self._read_trainer_state(folder)}
        if c.load_model is None:  # else the hook reads (and validates) the weights itself
            state, origin = read_weights(folder)
            staged["model"] = match_state_dict(c.model, state, origin, strict=True, source=find_weights_file(folder))
        if load_optimizer:
            staged.update(self._read_training_state(folder, c))
        rng_path, resized = rng_file_to_restore(folder, self.rank, self.world_size)
        if rng_path is not None:
            staged["rng"] = read_rng_file(rng_path, trusted=self.trust_pickles)
            if resized:
                logger.info("%s was written by another number of processes: rank %d restores the random streams "
                            "of %s", folder, self.rank, rng_path.name)
        else:
            logger.warning("no RNG state %s in %s; the random streams are not restored", self.rng_file, folder)
        data_path = folder / layout.DATA_STATE_NAME
        staged["data_state"] = _read_json(data_path, "data state") if data_path.is_file() else None
        state_path = folder / layout.TRAINER_STATE_NAME
        staged["trainer_state_path"] = str(state_path) if state_path.is_file() else None
        return staged

    @staticmethod
    def _read_trainer_state(folder: Path) -> dict[str, Any] | None:
        """``trainer_state.json`` checked against the TrainerState schema (None when absent); raises CheckpointError."""
        path = folder / layout.TRAINER_STATE_NAME
        if not path.is_file():
            return None
        data = _read_json(path, "trainer state")
        problems = trainer_state_problems(data)
        if problems:
            raise CheckpointError(f"{path}: not a valid trainer state ({'; '.join(problems)}); the file was edited or "
                                  "written by an incompatible tool: fix it, or resume from another checkpoint")
        return data

    def _read_training_state(self, folder: Path, c: CheckpointContents) -> dict[str, Any]:
        staged: dict[str, Any] = {}
        if c.optimizer is not None and (folder / layout.OPTIMIZER_NAME).is_file():
            saved = _torch_read(folder / layout.OPTIMIZER_NAME, "optimizer", self.trust_pickles)
            staged["optimizer"] = _check_optimizer_state(folder / layout.OPTIMIZER_NAME, saved, c.optimizer)
        elif c.optimizer is not None and not (folder / "fsdp_state").is_dir():  # FSDP's: the backend reads it
            logger.warning("%s has no %s (saved with save_only_model=True?); the optimizer starts fresh",
                           folder, layout.OPTIMIZER_NAME)
        if c.scheduler is not None and (folder / layout.SCHEDULER_NAME).is_file():
            staged["scheduler"] = _torch_read(folder / layout.SCHEDULER_NAME, "scheduler", self.trust_pickles)
        for name in c.extra:
            path = folder / f"{name}.pt"
            if path.is_file():
                staged[f"extra:{name}"] = _torch_read(path, name, self.trust_pickles)
            else:
                logger.warning("%s has no %s; %r keeps its current state", folder, path.name, name)
        return staged

    def load(self, folder: str | os.PathLike, contents: CheckpointContents, *, load_optimizer: bool = True,
             load_trainer_state: Callable[[str], Any] | None = None, verify: bool = True) -> dict[str, Any]:
        """Restore ``contents`` from ``folder``: model weights (strict), optimizer, scheduler, extras, this rank's RNG
        and ``rank_parts``.

        ``load_optimizer=False`` restores weights, data state and RNG only. Every file is validated before
        anything is applied (``verify=False`` skips the marker and pickle checks, when
        :mod:`~trainwell.checkpoint.agreement` did them already); a problem raises :class:`CheckpointError` naming
        the file. Returns
        ``{"data_state": dict | None, "trainer_state_path": str | None, "trainer_state": ... | None,
        "loaded": [names restored]}``; ``trainer_state`` is ``load_trainer_state(path)`` when given.
        """
        folder = Path(folder)
        staged = self._read_all(folder, contents, load_optimizer, verify)
        self._staged = (folder, staged)  # what the default hooks apply (apply_optimizer_and_scheduler, apply_rng)
        try:
            if contents.load_model is not None:
                contents.load_model(folder)
            else:
                contents.model.load_state_dict(staged["model"], strict=True)
            loaded = ["model"]
            if load_optimizer:
                if contents.load_optimizer_and_scheduler is not None:
                    contents.load_optimizer_and_scheduler(folder)
                    loaded += [name for name in ("optimizer", "scheduler") if name in staged]
                else:
                    loaded += self.apply_optimizer_and_scheduler(folder, contents)
            for name, obj in contents.extra.items():
                if f"extra:{name}" in staged:
                    obj.load_state_dict(staged[f"extra:{name}"])
                    loaded.append(name)
            if contents.load_rng is not None:  # called as upstream calls it, with or without an RNG file
                contents.load_rng(folder)
            elif "rng" in staged:
                self.apply_rng(folder)
            if "rng" in staged:
                loaded.append("rng")
            saved_rng = staged.get("rng") or {}
            for name, obj in contents.rank_parts.items():  # from the same file as the streams (whatever restored them)
                obj.load_state_dict(saved_rng.get(name) or {})
        finally:
            self._staged = None
        path = staged["trainer_state_path"]
        trainer_state = load_trainer_state(path) if (load_trainer_state and path) else None
        return {"data_state": staged["data_state"], "trainer_state_path": path,
                "trainer_state": trainer_state, "loaded": loaded}

    def _staged_for(self, folder: Path) -> dict[str, Any] | None:
        """What the load in progress read (and validated) from ``folder``; None outside such a load."""
        staged = self._staged
        return staged[1] if staged is not None and staged[0] == Path(folder) else None

    def apply_optimizer_and_scheduler(self, folder: str | os.PathLike, contents: CheckpointContents) -> list[str]:
        """Load ``optimizer.pt`` / ``scheduler.pt`` of ``folder`` into ``contents.optimizer`` / ``.scheduler``.

        Inside :meth:`load` the states it already read and validated are applied; called on its own (a subclass's
        ``_load_optimizer_and_scheduler`` calling ``super()``), the files are read and validated now. Returns the
        names loaded.
        """
        folder = Path(folder)
        staged = self._staged_for(folder)
        if staged is None:
            staged = self._read_training_state(folder, CheckpointContents(
                model=contents.model, optimizer=contents.optimizer, scheduler=contents.scheduler))
        loaded = []
        if "optimizer" in staged:
            contents.optimizer.load_state_dict(staged["optimizer"])
            loaded.append("optimizer")
        if "scheduler" in staged:
            contents.scheduler.load_state_dict(staged["scheduler"])
            loaded.append("scheduler")
        return loaded

    def apply_rng(self, folder: str | os.PathLike) -> bool:
        """Restore this rank's random streams from ``folder`` (what :meth:`load` staged, else read now); False when
        the checkpoint has no RNG file for this rank."""
        folder = Path(folder)
        staged = self._staged_for(folder)
        state = staged.get("rng") if staged is not None else None
        if state is None:
            rng_path, _ = rng_file_to_restore(folder, self.rank, self.world_size)
            if rng_path is None:
                return False
            state = read_rng_file(rng_path, trusted=self.trust_pickles)
        restore_rng_state(state)
        return True

    def load_latest_valid(self, contents: CheckpointContents, *, load_optimizer: bool = True,
                          load_trainer_state: Callable[[str], Any] | None = None,
                          engine_load: Callable[[Path], None] | None = None,
                          engine_check: Callable[[Path], None] | None = None,
                          context: Callable[[], Any] | None = None) -> tuple[Path, dict[str, Any]]:
        """Load the newest complete checkpoint that every rank validates and loads, falling back to older ones.

        A collective when ``world_size > 1`` (see :mod:`trainwell.checkpoint.agreement`): all ranks end on the
        same checkpoint. ``engine_load(folder)`` (the backend's ``load``) runs after trainwell's files, inside the
        same fallback, ``engine_check(folder)`` (the backend's ``check_checkpoint``) in the validation step;
        ``context()`` wraps the loading of trainwell's files. Each damaged checkpoint is reported
        (``warnings.warn`` and ``logger.warning``). Raises ValueError when ``output_dir`` has no complete
        checkpoint, CheckpointError when none of them loads, UnsafeCheckpointError for a refused pickle.
        """
        return load_agreed(self, candidates(self), contents, fallback=True, load_optimizer=load_optimizer,
                           load_trainer_state=load_trainer_state, engine_load=engine_load,
                           engine_check=engine_check, context=context)

    def load_agreed(self, folder: str | os.PathLike, contents: CheckpointContents, *, load_optimizer: bool = True,
                    load_trainer_state: Callable[[str], Any] | None = None,
                    engine_load: Callable[[Path], None] | None = None,
                    engine_check: Callable[[Path], None] | None = None,
                    context: Callable[[], Any] | None = None) -> dict[str, Any]:
        """:meth:`load` of one given folder by every rank together: all succeed or all raise (no fallback)."""
        return load_agreed(self, [Path(folder)], contents, fallback=False, load_optimizer=load_optimizer,
                           load_trainer_state=load_trainer_state, engine_load=engine_load,
                           engine_check=engine_check, context=context)[1]


def _missing_checkpoint_hint(path: Path) -> str:
    """What to pass instead of ``path``, which is not a folder: the checkpoint folder holding a file, the switches
    for a guessed word (``"latest"``), else the plain fact."""
    if path.is_file():
        return f"a file; pass the checkpoint folder that holds it: {path.parent}"
    if len(path.parts) == 1 and not path.exists() and str(path).strip().lower() in (
            "latest", "last", "newest", "resume", "yes", "true", "1"):
        return ("not a folder; for the newest checkpoint of output_dir pass resume_from_checkpoint=True (or "
                "'auto': the newest if there is one, else a fresh start)")
    return "no such checkpoint folder"
