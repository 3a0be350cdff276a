"""Checkpoints: atomic folders, discovery, rotation, weights files, RNG state and preemption handling.

Public names are resolved lazily so that ``import trainwell.checkpoint`` (and ``get_last_checkpoint``) does
not import torch:

- layout: :data:`COMPLETE_MARKER`, :class:`CheckpointError`, :func:`is_complete`, :func:`list_complete_checkpoints`,
  :func:`list_foreign_checkpoints`, :func:`list_resumable_checkpoints`, :func:`get_last_checkpoint`, :func:`list_incomplete`, :func:`cleanup_incomplete`, :func:`atomic_checkpoint_dir`, :func:`write_atomic`,
  :func:`verify_checkpoint`, :func:`delete_checkpoint`
- weights: :func:`save_model_weights`, :func:`load_model_weights`, :func:`load_state_dict_from_folder`
- rng: :func:`capture_rng_state`, :func:`restore_rng_state`, :func:`rng_file_name`
- manager: :class:`CheckpointContents`, :class:`CheckpointManager`
- preemption: :class:`PreemptionGuard`
- lock: :class:`OutputDirLock`, :class:`OutputDirLockedError` (one run per ``output_dir``)
"""

from __future__ import annotations

from ..utils.lazy_exports import lazy_exports

_EXPORTS = {
    "COMPLETE_MARKER": "layout",
    "CheckpointError": "layout",
    "is_complete": "layout",
    "list_complete_checkpoints": "layout",
    "list_foreign_checkpoints": "layout",
    "list_resumable_checkpoints": "layout",
    "get_last_checkpoint": "layout",
    "list_incomplete": "layout",
    "cleanup_incomplete": "layout",
    "atomic_checkpoint_dir": "layout",
    "write_atomic": "layout",
    "verify_checkpoint": "layout",
    "delete_checkpoint": "layout",
    "save_model_weights": "weights",
    "load_model_weights": "weights",
    "load_state_dict_from_folder": "weights",
    "capture_rng_state": "rng",
    "restore_rng_state": "rng",
    "rng_file_name": "rng",
    "CheckpointContents": "manager",
    "CheckpointManager": "manager",
    "PreemptionGuard": "preemption",
    "OutputDirLock": "lock",
    "OutputDirLockedError": "lock",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
