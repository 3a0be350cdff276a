"""DeepSpeed checkpoints resumed on another number of processes, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint holds one optimizer partition per rank (``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``), cut
for the number of ranks that wrote it. DeepSpeed's own tool for another number, ``ds_to_universal``, rewrites the
partitions as one file per parameter and state (fp32 master weights, Adam moments, step); an engine whose config
has ``checkpoint.load_universal`` reads those into its own partitions. :func:`load_resized` runs both for the user,
in steps that every rank takes together, so that no rank is left waiting in a collective another rank never joins:

1. Every rank reports which partitions it sees in its copy of the checkpoint. If any rank does not see all of them
   (one disk per node, each holding only its own node's partitions), every rank refuses, naming the layout.
2. Rank 0 converts the checkpoint into ``output_dir/.tmp-universal-<tag>-<pid>`` (the checkpoint itself is never
   modified: its marker's checksums stay valid); every rank learns whether it succeeded.
3. Every rank checks that it sees the converted folder. Where ranks do not (their ``output_dir`` is another disk:
   ``save_on_each_node=True``, one disk per node), the first rank of each such node converts its own copy onto its
   own disk, and every rank checks again; a rank that still sees no conversion makes every rank refuse.
4. Every rank loads from the conversion its node sees; then each converting rank deletes its folder.

A process killed during the conversion leaves its ``.tmp-universal-*`` folder (tens of GB for a large model: the fp32
weights and both Adam moments); the next ``train()`` removes it with trainwell's other temporary folders
(:func:`trainwell.checkpoint.layout.cleanup_incomplete`), since the folder is named after the converting process.
"""

from __future__ import annotations

import logging
import os
import shutil
import contextlib
import io
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ...checkpoint.commit import test_hook
from ...checkpoint.layout import CheckpointError
from ...checkpoint.nodes import node_index
from ...runtime.distributed import get_rank, all_gather_object, barrier, get_world_size

logger = logging.getLogger("trainwell.deepspeed")

#: Prefix of the conversion folders (``.tmp-universal-<tag>-<pid>``), known to the start-up clean-up.
CONVERSION_PREFIX = ".tmp-universal-"


def _convert(step_folder: Path, output: Path) -> None:
    """``ds_to_universal`` of one tag folder (one worker each: the conversion is file work, not compute)."""
    from deepspeed.checkpoint.ds_to_universal import main

    options = SimpleNamespace(input_folder=str(step_folder), output_folder=str(output), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=True)  # trainwell's engines save no Megatron client state
    with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed prints its progress
        main(options)


def _partitions_seen(folder: Path, tag: str) -> list[int]:
    """The ranks whose ZeRO optimizer partition this process sees in ``folder/tag``."""
    seen = []
    for path in (folder / tag).glob("*zero_pp_rank_*_mp_rank_00_optim_states.pt"):
        rank = path.name.split("zero_pp_rank_", 1)[1].split("_", 1)[0]
        if rank.isdigit():
            seen.append(int(rank))
    return sorted(seen)


def _convert_here(folder: Path, tag: str, scratch: Path) -> tuple[str | None, str | None]:
    """Convert ``folder``'s ``tag`` into a new conversion folder of ``scratch``: (its path, None) or (None, error)."""
    # absolute: the path is sent to the other ranks, whose working folder may differ (a relative output_dir)
    converted = scratch.resolve() / f"{CONVERSION_PREFIX}{tag}-{os.getpid()}"
    try:
        scratch.mkdir(parents=True, exist_ok=True)
        if converted.exists():  # this very process's left-over of an earlier attempt
            shutil.rmtree(converted)
        converted.mkdir()
        _convert(folder / tag, converted / f"{tag}_universal")
        test_hook("universal", int("".join(c for c in tag if c.isdigit()) or 0), get_rank())
    except Exception as err:
        shutil.rmtree(converted, ignore_errors=True)
        return None, f"{type(err).__name__}: {err}"
    return str(converted), None


def _refuse_partial_copies(folder: Path, views: list[tuple[int, list[int]]], saved_world: int) -> None:
    """Step 1: every rank must see every partition, or every rank refuses (the same data on every rank)."""
    everything = sorted({r for _, seen in views for r in seen})
    wanted = list(range(max([saved_world - 1, *everything]) + 1))
    blind = sorted({(rank, node) for rank, (node, seen) in enumerate(views) if seen != wanted})
    if blind:
        raise CheckpointError(
            f"{folder}: resuming this ZeRO checkpoint on {len(views)} process(es) needs all {len(wanted)} optimizer "
            f"partitions it was written in, but rank(s) {[r for r, _ in blind]} (node(s) "
            f"{sorted({n for _, n in blind})}) see only some of them in their copy of the folder. With one disk per "
            "node (save_on_each_node=True) each node holds only its own ranks' partitions: copy every node's "
            f"{folder.name}/ files into one folder every node sees and resume from there, or resume on the "
            f"{len(wanted)} process(es) that wrote it")


def load_resized(engine: Any, folder: Path, *, saved_world: int, scratch: Path) -> None:
    """Load the DeepSpeed checkpoint in ``folder`` (written by ``saved_world`` ranks) into ``engine`` on this
    number of ranks (a collective; the steps of the module docstring). ``scratch``: where a conversion is written
    (this rank's ``output_dir``)."""
    rank, world = get_rank(), get_world_size()
    tag = (folder / "latest").read_text(encoding="utf-8").strip()
    views = all_gather_object((node_index(rank), _partitions_seen(folder, tag)))
    _refuse_partial_copies(folder, views, saved_world)
    mine: list[str] = []  # the conversions this rank wrote (and deletes at the end)
    error = None
    if rank == 0:
        logger.warning("%s was written by %d DeepSpeed process(es) and this run has %d: converting it with "
                       "DeepSpeed's ds_to_universal to load it", folder, saved_world, world)
        made, error = _convert_here(folder, tag, scratch)
        mine += [made] if made else []
    try:
        first, error = all_gather_object((mine[0] if mine else None, error))[0]
        if error is not None:
            raise CheckpointError(f"{folder}: DeepSpeed's ds_to_universal could not convert the checkpoint for "
                                  f"{world} process(es) ({error}); resume on {saved_world} process(es)")
        assert first is not None  # rank 0 converted without an error, so it names its conversion
        use = _conversion_seen_here(folder, tag, scratch, first, views, mine)
        config = engine._config  # read by engine.load_checkpoint only: on for this load, off again afterwards
        config.load_universal_checkpoint = True
        try:
            path, _ = engine.load_checkpoint(use, tag=f"{tag}_universal", load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
        finally:
            config.load_universal_checkpoint = False
        if path is None:
            raise CheckpointError(f"{folder}: DeepSpeed could not load the universal conversion of the checkpoint")
        _unshare_steps(engine.optimizer)
    finally:
        barrier()
        for made in mine:
            shutil.rmtree(made, ignore_errors=True)


def _conversion_seen_here(folder: Path, tag: str, scratch: Path, first: str, views: list[tuple[int, list[int]]],
                          mine: list[str]) -> str:
    """Step 3 (a collective): the conversion this rank loads, rank 0's where every rank sees it, else its node's own
    (converted here by the node's first rank, appended to ``mine``); every rank refuses when a rank sees none."""
    rank = get_rank()
    sees = all_gather_object(Path(first).is_dir())
    if all(sees):
        return first
    node = views[rank][0]
    blind_nodes = {views[r][0] for r, saw in enumerate(sees) if not saw}
    error = None
    if node in blind_nodes and rank == min(r for r, (n, _) in enumerate(views) if n == node):
        logger.warning("rank 0's conversion of %s is not on this node's disk (%s): converting this node's copy",
                       folder, scratch)
        made, error = _convert_here(folder, tag, scratch)
        mine += [made] if made else []
    reports = all_gather_object((node, mine[-1] if mine and node in blind_nodes else None, error))
    failed = [f"node {n}: {e}" for n, _, e in reports if e is not None]
    if failed:
        raise CheckpointError(f"{folder}: converting each node's copy of the checkpoint failed ("
                              + "; ".join(failed) + ")")
    per_node = {n: p for n, p, _ in reports if p is not None}
    use = per_node.get(node) if node in blind_nodes else first
    sees = all_gather_object(use is not None and Path(use).is_dir())
    if not all(sees):
        raise CheckpointError(
            f"{folder}: rank(s) {[r for r, saw in enumerate(sees) if not saw]} see no conversion of the checkpoint "
            f"on their disk: the ranks of one node do not share its output_dir ({scratch} here). Give the ranks of "
            "a node one output_dir, or put output_dir on a file system every node sees")
    assert use is not None  # every rank sees its conversion, this one included
    return use


def _unshare_steps(zero_optimizer: Any) -> None:
    """Give every parameter group its own ``step`` tensor again.

    DeepSpeed's ZeRO-3 universal loader (0.19) stores one and the same ``step`` tensor in the state of every
    sub-group; torch's Adam increments it in place once per sub-group, so after one step a model of two groups
    counts two and the bias correction drifts (8.5e-4 after 6 steps on the test's model).
    """
    inner = getattr(zero_optimizer, "optimizer", None)
    for state in getattr(inner, "state", {}).values():
        step = state.get("step")
        if isinstance(step, torch.Tensor):
            state["step"] = step.clone()
