"""DeepSpeed checkpoints resumed on another number of processes, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds one optimizer partition per rank (``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``), cut
for the number of ranks that wrote it. DeepSpeed's own tool for another number, ``ds_to_universal``, rewrites the
partitions as one file per parameter and state (fp32 master weights, Adam moments, step); an engine whose config
has ``checkpoint.load_universal`` reads those into its own partitions. :func:`load_resized` runs both for the user:
rank 0 converts the checkpoint into a temporary folder of ``output_dir`` (the checkpoint itself is never
modified: its marker's checksums stay valid), every rank loads from it, then rank 0 deletes it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

logger = logging.getLogger("trainwell.deepspeed")


def _convert(step_folder: Path, output: Path) -> None:
    """``ds_to_universal`` of one tag folder (one worker each: the conversion is file work, not compute)."""
    import contextlib
    import io

    from deepspeed.checkpoint.ds_to_universal import main

    options = SimpleNamespace(input_folder=str(step_folder), output_folder=str(output), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)  # trainwell's engines save no Megatron client state
    with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints its progress
        main(options)


def load_resized(engine: Any, folder: Path, *, saved_world: int, scratch: Path) -> None:
    """Load the DeepSpeed checkpoint in ``folder`` (written by ``saved_world`` ranks) into ``engine`` on this
    number of ranks (a collective). ``scratch``: the folder where rank 0 writes the conversion (``output_dir``)."""
    from ...checkpoint.layout import CheckpointError
    from ...runtime.distributed import all_gather_object, barrier, get_rank, get_world_size

    tag = (folder / "latest").read_text(encoding="utf-8").strip()
    converted: str | None = None
    error: str | None = None
    if get_rank() == 0:
        logger.warning("%s was written by %d DeepSpeed process(es) and this run has %d: converting it with "
                       "DeepSpeed's ds_to_universal to load it", folder, saved_world, get_world_size())
        try:
            scratch.mkdir(parents=True, exist_ok=True)
            converted = tempfile.mkdtemp(prefix=f".tmp-universal-{tag}-", dir=scratch)
            _convert(folder / tag, Path(converted) / f"{tag}_universal")
        except Exception as err:  # noqa: BLE001 - every rank must learn of it (below), not wait in a collective
            error = f"{type(err).__name__}: {err}"
    converted, error = all_gather_object((converted, error))[0]
    try:
        if error is not None:
            raise CheckpointError(f"{folder}: DeepSpeed's ds_to_universal could not convert the checkpoint for "
                                  f"{get_world_size()} process(es) ({error}); resume on {saved_world} process(es)")
        config = engine._config  # read by engine.load_checkpoint only: on for this load, off again afterwards
        config.load_universal_checkpoint = True
        try:
            path, _ = engine.load_checkpoint(converted, tag=f"{tag}_universal", load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
        finally:
            config.load_universal_checkpoint = False
        if path is None:
            raise CheckpointError(f"{folder}: DeepSpeed could not load the universal conversion of the checkpoint")
        _unshare_steps(engine.optimizer)
    finally:
        barrier()
        if get_rank() == 0 and converted is not None:
            shutil.rmtree(converted, ignore_errors=True)


def _unshare_steps(zero_optimizer: Any) -> None:
    """Give every parameter group its own ``step`` tensor again.

    DeepSpeed's ZeRO-3 universal loader (0.19) stores one and the same ``step`` tensor in the state of every
    sub-group; torch's Adam increments it in place once per sub-group, so after one step a model of two groups
    counts two and the bias correction drifts (8.5e-4 after 6 steps on the test's model).
    """
    import torch

    inner = getattr(zero_optimizer, "optimizer", None)
    for state in getattr(inner, "state", {}).values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.clone()
