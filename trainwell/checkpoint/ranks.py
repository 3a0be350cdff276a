"""The ranks taking part in a save or a resume, and the object collectives the checkpoint protocols run on them."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..runtime.distributed import is_dist, all_gather_object, barrier


class Ranks:
    """The processes that take part in a save or a resume, and the few collectives the protocols need.

    Every collective is an object all-gather (a few bytes), run only at save and resume time. With one process,
    or no process group, they are local no-ops. ``group``: the process group they run on (default: the training
    one); an asynchronous save passes its own gloo group, so that the saver thread never issues collectives on
    the group the training thread uses (two threads must not interleave collectives on one group).
    """

    def __init__(self, rank: int = 0, world_size: int = 1, *, group: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.group = group

    @property
    def active(self) -> bool:
        """True when several processes take part (a process group is initialised)."""
        if self.world_size <= 1:
            return False

        return is_dist()

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` of every rank, in rank order."""
        if not self.active:
            return [obj]
        if self.group is None:
            return all_gather_object(obj)

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def barrier(self) -> None:
        """Wait for every rank."""
        if not self.active:
            return
        if self.group is None:
            barrier()
        else:
            dist.barrier(group=self.group)
