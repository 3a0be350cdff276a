"""Resume decided by every rank together: validate, agree on the newest checkpoint valid everywhere, then load.

For each candidate (newest first; the candidates every rank sees):

1. every rank checks its share of the checkpoint's files (the files recorded in the marker are split across the
   ranks of a node: sizes and checksums) plus the pickle safety of the files an engine unpickles
   (:mod:`trainwell.checkpoint.safe_pickle`); its own RNG file it always checks;
2. the ranks exchange the results: if any rank found a problem, every rank moves to the next candidate (or every
   rank raises, when falling back is not allowed); a refused pickle always raises on every rank (it is not damage
   to skip silently but content nobody should run);
3. every rank loads (trainwell's files, then the engine's: DeepSpeed, DCP); any failure an engine can raise is caught
   (``BaseException`` subclasses such as DCP's ``CheckpointException`` too, but not ``KeyboardInterrupt`` /
   ``SystemExit``), the ranks exchange the outcome, and if any rank failed all move to the next candidate together.

So the ranks never resume from different checkpoints.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any, Protocol

from . import layout
from .layout import CheckpointError
from .ranks import Ranks
from .safe_pickle import UnsafeCheckpointError, check_pickle_file, pickle_files

logger = logging.getLogger(__name__)

_NOT_CAUGHT = (KeyboardInterrupt, SystemExit, GeneratorExit)


class ResumingManager(Protocol):
    """What the agreement needs of a :class:`~trainwell.checkpoint.manager.CheckpointManager` (which calls it)."""

    output_dir: Path
    rank: int
    world_size: int
    trust_pickles: bool

    @property
    def ranks(self) -> Ranks: ...

    @property
    def rng_file(self) -> str: ...

    def load(self, folder: str | os.PathLike, contents: Any, *, load_optimizer: bool = True,
             load_trainer_state: Callable[[str], Any] | None = None, verify: bool = True) -> dict[str, Any]: ...


def local_share(rank: int, world_size: int) -> tuple[int, int]:
    """``(index, count)`` of this rank among the ranks of its node (the launcher's LOCAL_RANK/LOCAL_WORLD_SIZE)."""
    try:
        count = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        index = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        return rank, world_size
    return (index, count) if 0 <= index < count else (rank, world_size)


def _files_on_disk(folder: Path) -> list[str]:
    found = []
    for dirpath, _dirs, names in os.walk(folder):
        for name in names:
            found.append((Path(dirpath) / name).relative_to(folder).as_posix())
    return sorted(found)


def verify_share(folder: Path, *, share: tuple[int, int], own: list[str], trust_pickles: bool) -> None:
    """Check this rank's share of ``folder`` (and the files in ``own`` entirely); raise CheckpointError."""
    index, count = share
    if (folder / layout.COMPLETE_MARKER).is_file():  # whether an unmarked folder may be loaded is discovery's call
        layout.verify_checkpoint(folder, select=lambda i, rel: i % count == index or rel in own)
    if trust_pickles:
        return
    for i, rel in enumerate(pickle_files(folder, _files_on_disk(folder))):
        if i % count == index or rel in own:
            check_pickle_file(folder / rel)


def _agree(manager: ResumingManager, error: BaseException | None) -> list[tuple[int, str, bool]]:
    """Every rank's failure: ``[(rank, message, unsafe)]`` (empty when every rank succeeded)."""
    mine = None if error is None else (f"{type(error).__name__}: {error}", isinstance(error, UnsafeCheckpointError))
    return [(r, item[0], item[1]) for r, item in enumerate(manager.ranks.gather(mine)) if item is not None]


def candidates(manager: ResumingManager) -> list[Path]:
    """The resumable checkpoints of ``output_dir`` that every rank sees, newest first.

    trainwell's (with the marker) and foreign ones (``checkpoint-<step>`` without it, e.g. the upstream Trainer's:
    trainwell never leaves a half-written folder under that name), see :func:`layout.list_resumable_checkpoints`.
    """
    mine = [p.name for p in layout.list_resumable_checkpoints(manager.output_dir)]
    seen = manager.ranks.gather(mine)
    common = set(seen[0]).intersection(*map(set, seen[1:]))
    return [manager.output_dir / name for name in reversed(mine) if name in common]


def load_agreed(manager: ResumingManager, folders: list[Path], contents: Any, *,
                fallback: bool, load_optimizer: bool = True,
                load_trainer_state: Callable[[str], Any] | None = None,
                engine_load: Callable[[Path], None] | None = None,
                engine_check: Callable[[Path], None] | None = None,
                context: Callable[[], AbstractContextManager[Any]] | None = None) -> tuple[Path, dict[str, Any]]:
    """Load the first of ``folders`` that every rank validates and loads (see the module docstring).

    ``engine_check(folder)`` (optional) runs in the validation step: the engine's own check that this rank's files
    are there. ``fallback=False`` raises on every rank at the first failure. Raises ValueError when ``folders`` is
    empty and CheckpointError when none loads.
    """
    if not folders:
        raise ValueError(f"No valid checkpoint found in output directory ({manager.output_dir})")
    share = local_share(manager.rank, manager.world_size)
    failures: list[str] = []
    for i, folder in enumerate(folders):
        folder = Path(folder)
        result: dict[str, Any] | None = None
        error: BaseException | None = None
        try:
            verify_share(folder, share=share, own=[manager.rng_file], trust_pickles=manager.trust_pickles)
            if engine_check is not None:
                engine_check(folder)
        except CheckpointError as err:
            error = err
        problems = _agree(manager, error)
        if not problems:
            try:
                with (context() if context is not None else nullcontext()):
                    result = manager.load(folder, contents, load_optimizer=load_optimizer,
                                          load_trainer_state=load_trainer_state, verify=False)
                if engine_load is not None:
                    engine_load(folder)
            except BaseException as err:  # noqa: B036 - DCP raises BaseException subclasses; see _NOT_CAUGHT
                if isinstance(err, _NOT_CAUGHT):
                    raise
                error = err
            problems = _agree(manager, error)
        if not problems:
            assert result is not None  # no rank reported a problem, so this rank's load ran to the end
            return folder, result
        described = "; ".join(f"rank {r}: {message}" for r, message, _ in problems)
        unsafe = [message for _, message, is_unsafe in problems if is_unsafe]
        if unsafe:
            if isinstance(error, UnsafeCheckpointError):
                raise error
            raise UnsafeCheckpointError(f"{folder}: refused on another rank: {unsafe[0]}")
        failures.append(f"{folder.name}: {described}")
        if not fallback:
            if isinstance(error, CheckpointError):
                raise error
            raise CheckpointError(f"cannot resume from {folder}: {described}") from error
        if i + 1 < len(folders):
            message = f"checkpoint {folder} is damaged ({described}); falling back to {folders[i + 1]} (every rank)"
            logger.warning(message)
            warnings.warn(message, stacklevel=3)
    raise CheckpointError(f"no checkpoint in {manager.output_dir} could be loaded:\n  " + "\n  ".join(failures)
                          + "\nmove the damaged checkpoint folders away (or delete them), or start over with "
                          "resume_from_checkpoint=None")
