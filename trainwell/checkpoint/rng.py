"""Random-number-generator state of one process: python, numpy, torch CPU, every CUDA device, MPS.

Saved per rank (``rng_state.pth`` for one process, ``rng_state_<rank>.pth`` otherwise) so that a resumed run
draws the same dropout masks and shuffles as an uninterrupted one. The file is upstream's: the same keys and value
types (``numpy`` is ``np.random.get_state()``'s tuple; ``cuda`` one state tensor for a single process, a list of
them with several), so the upstream Trainer resumes from it and trainwell from upstream's. It is read back with
``torch.load(weights_only=True)`` allowing only numpy's array reconstruction on top of torch's safe types.

A job resumed on another number of processes (elastic resume) restores, on its rank ``r``, the stream rank ``r`` of
the saving job had, or, when the saving job had fewer processes, that of rank ``r mod W`` (``W``: the saving job's
number of processes); see :func:`rng_file_to_restore`. Every rank of a fresh run starts from the same seed
(``set_seed(args.seed)``), so a new rank continues a stream it would have shared with that rank at the start.
"""

from __future__ import annotations

import logging
import os
import random
import warnings
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .layout import CheckpointError
from .safe_pickle import load_error

logger = logging.getLogger(__name__)


def rng_file_name(rank: int, world_size: int) -> str:
    """``rng_state.pth`` for a single process, ``rng_state_<rank>.pth`` when ``world_size > 1``."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


def saved_rng_files(folder: str | os.PathLike) -> dict[int, Path]:
    """``{rank: file}`` of the RNG files in a checkpoint folder (``rng_state.pth`` is rank 0 of one process)."""
    folder = Path(folder)
    found: dict[int, Path] = {}
    single = folder / "rng_state.pth"
    if single.is_file():
        found[0] = single
    for path in folder.glob("rng_state_*.pth"):
        suffix = path.stem.rsplit("_", 1)[1]
        if suffix.isdigit():
            found[int(suffix)] = path
    return found


def rng_file_to_restore(folder: str | os.PathLike, rank: int, world_size: int) -> tuple[Path | None, bool]:
    """The RNG file rank ``rank`` of a job of ``world_size`` processes restores from ``folder``, and whether it
    is another rank's (the checkpoint was written by another number of processes).

    Its own file when present; otherwise, when the checkpoint was written by another number ``W`` of processes
    (its RNG files are not ``0..world_size-1``), rank ``rank`` of the saving job's, or rank ``rank mod W``'s when
    the saving job had fewer. ``(None, False)`` when the file is missing from a checkpoint of the same size.
    """
    own = Path(folder) / rng_file_name(rank, world_size)
    if own.is_file():
        return own, False
    saved = saved_rng_files(folder)
    # a complete set: rng_state.pth alone (one process), or rng_state_0..W-1 with W >= 2; anything else is damage
    complete = sorted(saved) == list(range(len(saved))) and (len(saved) >= 2 or (Path(folder) / "rng_state.pth")
                                                               .is_file())
    if not saved or not complete or len(saved) == world_size:
        return None, False
    return saved[rank % len(saved)], True


def _numpy_state() -> tuple[Any, ...] | dict[str, Any]:  # the tuple (legacy=True, the default); numpy's stub names both
    return np.random.get_state()  # upstream's form: ("MT19937", uint32 array, pos, has_gauss, cached_gaussian)


def _set_numpy_state(state: Any) -> None:
    np.random.set_state(state)


def _numpy_safe_globals() -> list:
    """What ``torch.load(weights_only=True)`` must allow to read ``np.random.get_state()`` (upstream's list)."""
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available() and hasattr(torch, "mps"))


def capture_rng_state() -> dict[str, Any]:
    """The current generator states: keys ``python``, ``numpy``, ``cpu`` and, when present, ``cuda``, ``mps``."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        # as upstream: one process (maybe DataParallel) saves the current device's state, several save them all
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized() \
            and torch.distributed.get_world_size() > 1
        state["cuda"] = torch.cuda.get_rng_state_all() if distributed else torch.cuda.get_rng_state()
    if _mps_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def rng_states_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two :func:`capture_rng_state` results hold the same states (no generator drew in between)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            return bool(np.array_equal(x, y))
        if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
            return len(x) == len(y) and all(same(u, v) for u, v in zip(x, y))
        return bool(x == y)

    return a.keys() == b.keys() and all(same(a[key], b[key]) for key in a)


def _restore_cuda(states: Any) -> None:
    if not torch.cuda.is_available():
        logger.warning("the checkpoint holds CUDA RNG states but CUDA is not available; they are not restored")
        return
    if isinstance(states, torch.Tensor):  # one process: the current device's state
        torch.cuda.set_rng_state(states)
        return
    count = torch.cuda.device_count()
    if len(states) != count:
        warnings.warn(f"the checkpoint holds CUDA RNG states of {len(states)} devices but {count} are visible; "
                      f"restoring the first {min(count, len(states))}", stacklevel=3)
    for index, device_state in enumerate(states[:count]):
        torch.cuda.set_rng_state(device_state, index)


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator present in ``state`` (from :func:`capture_rng_state`); absent parts are skipped."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        _set_numpy_state(state["numpy"])
    if "cpu" in state:
        torch.random.set_rng_state(state["cpu"])
    if state.get("cuda") is not None:
        _restore_cuda(state["cuda"] if isinstance(state["cuda"], torch.Tensor) else list(state["cuda"]))
    if state.get("mps") is not None and _mps_available():
        torch.mps.set_rng_state(state["mps"])


def read_rng_file(path: str | os.PathLike, *, trusted: bool = False) -> dict[str, Any]:
    """Read an RNG state file (safe loading unless ``trusted``); raises CheckpointError when it is unreadable."""
    try:
        with torch.serialization.safe_globals(_numpy_safe_globals()):
            state = torch.load(Path(path), map_location="cpu", weights_only=not trusted)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as err:
        raise load_error(Path(path), "RNG", err) from err
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a dict of RNG states, found {type(state).__name__}")
    return state
