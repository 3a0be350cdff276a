"""Which ranks write a checkpoint when the job spans several nodes: one shared folder, or one disk per node.

Nodes are told apart by the launcher, not by host names (two nodes may share a host: containers, or two launchers
on one machine): torchrun's ``GROUP_RANK`` (the node rank), else ``rank // LOCAL_WORLD_SIZE``.

At the first save of a multi-node job, rank 0 writes a probe file into its ``output_dir`` and the first rank of
every other node looks for it in its own ``output_dir`` (the path may differ from node to node). Then:

- every node sees it (a shared file system): only rank 0 writes, whatever ``save_on_each_node`` says (two node
  leaders writing one folder would seal and rename the same temporary folder);
- no other node sees it (one disk per node): with ``save_on_each_node=True`` the first rank of each node writes a
  complete checkpoint onto its node's disk (the shared files, and the per-rank files of its node's ranks, listed
  in its marker); with ``save_on_each_node=False`` the save is refused, naming the setting and the fix;
- some nodes see it and some do not: refused (give every node the same folder, or each its own disk).

The decision is taken once per ``output_dir`` and process (a collective of every rank, at the first save).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from .layout import CheckpointError

if TYPE_CHECKING:  # pragma: no cover
    from .ranks import Ranks

PROBE_PREFIX = ".trainwell-node-probe-"
SHARED, PER_NODE, ONE_NODE = "shared", "per-node", "one-node"
_decided: dict[str, str] = {}


def node_index(rank: int) -> int:
    """This process's node: the launcher's ``GROUP_RANK``, else ``rank // LOCAL_WORLD_SIZE`` (0 without them)."""
    for name in ("GROUP_RANK", "NODE_RANK"):
        value = os.environ.get(name, "")
        if value.strip().isdigit():
            return int(value)
    per_node = os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("LOCAL_SIZE", ""))
    if per_node.strip().isdigit() and int(per_node) > 0:
        return rank // int(per_node)
    return 0


def _probe(root: Path, ranks: "Ranks", places: list[tuple[int, bool]]) -> list[int]:
    """The nodes (other than rank 0's) whose first rank sees rank 0's probe file in its own ``root``."""
    name = ranks.gather(f"{PROBE_PREFIX}{uuid.uuid4().hex}")[0]
    probe = root / name
    if ranks.rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        probe.write_text(name, encoding="utf-8")
    ranks.barrier()
    node, leader = places[ranks.rank]
    sees = None
    if leader and node != places[0][0]:
        try:
            sees = probe.read_text(encoding="utf-8") == name
        except OSError:
            sees = False
    answers = ranks.gather(sees)
    if ranks.rank == 0:
        probe.unlink(missing_ok=True)
    return [places[r][0] for r, answer in enumerate(answers) if answer]


def writes_here(root: Path, ranks: "Ranks", should_save: bool, *, engine_needs_shared_folder: bool = False) -> bool:
    """Whether this rank writes the checkpoints of ``root`` (its ``output_dir``): see the module docstring.

    A collective at the first call for ``root`` (every rank must call it); raises CheckpointError on every rank for
    a layout that cannot hold a complete checkpoint. ``engine_needs_shared_folder`` (FSDP's DCP state: every rank's
    shard in one folder, its index written by rank 0 only) refuses one disk per node too.
    """
    key = str(Path(root).resolve())
    kind = _decided.get(key)
    if kind is None:
        kind = _decide(Path(root), ranks, should_save)
        _decided[key] = kind
    if kind == PER_NODE and engine_needs_shared_folder:
        raise CheckpointError(
            f"output_dir {root} is on one disk per node, but this backend's sharded state (FSDP's DCP files) is "
            "written by every rank into one folder and indexed by rank 0 only, so no node would hold a complete "
            "checkpoint; put output_dir on a file system every node sees")
    if kind == SHARED:
        return ranks.rank == 0
    return should_save


def saving_nodes(root: Path) -> int:
    """How many nodes write their own copy of ``root``'s checkpoints: the number of nodes with one disk per node
    (decided at the first save), else 1."""
    if _decided.get(str(Path(root).resolve())) != PER_NODE:
        return 1
    per_node = os.environ.get("LOCAL_WORLD_SIZE", "")
    world = os.environ.get("WORLD_SIZE", "")
    if per_node.isdigit() and world.isdigit() and int(per_node) > 0:
        return int(world) // int(per_node)
    return 1


def _decide(root: Path, ranks: "Ranks", should_save: bool) -> str:
    if not ranks.active:
        return ONE_NODE
    node = node_index(ranks.rank)
    reports = ranks.gather((node, should_save))
    nodes = sorted({n for n, _ in reports})
    if len(nodes) == 1:
        return ONE_NODE
    first: dict[int, int] = {}
    for rank, (n, _) in enumerate(reports):
        first.setdefault(n, rank)
    places = [(n, first[n] == rank) for rank, (n, _) in enumerate(reports)]
    seeing = set(_probe(root, ranks, places))
    others = [n for n in nodes if n != reports[0][0]]
    if seeing == set(others):
        return SHARED
    if seeing:
        raise CheckpointError(
            f"output_dir {root} is shared by some nodes only: nodes {sorted(seeing)} see rank 0's folder, nodes "
            f"{sorted(set(others) - seeing)} do not; give every node the same shared output_dir, or every node its "
            "own disk with save_on_each_node=True")
    savers = {n for n, saves in reports if saves}
    if savers != set(nodes):
        raise CheckpointError(
            f"output_dir {root} is not shared between the nodes (nodes {others} do not see the file rank 0 wrote "
            "there): each node has its own disk, and with save_on_each_node=False only rank 0 would write, so the "
            "other nodes' ranks could not store their files nor resume; set save_on_each_node=True (each node's "
            "first process then writes a complete checkpoint onto its node's disk), or put output_dir on a file "
            "system every node sees")
    return PER_NODE
