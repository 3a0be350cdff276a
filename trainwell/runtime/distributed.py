"""Process topology from the launcher's environment, device choice, and small collectives.

Every launcher leaves its own variables behind: torchrun / ``torch.distributed.run`` and the
``deepspeed`` launcher set ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``; the old ``torch.distributed.launch`` passes
``--local_rank`` (read into ``TrainingArguments.local_rank``); ``accelerate launch`` sets the same variables;
SLURM's ``srun`` sets ``SLURM_PROCID``/``SLURM_STEP_NUM_TASKS``/``SLURM_LOCALID``; ``mpirun`` its ``OMPI_COMM_WORLD_*``.
Nothing here has side effects at import time (except that :func:`read_launch_env` fills ``MASTER_ADDR`` for a bare
``srun``); the process group is created by :func:`init_process_group` when training starts.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import types
import warnings
import atexit
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .extension_builds import describe_build_locks


@dataclass(frozen=True)
class LaunchEnv:
    """Where this process sits: global rank, number of processes, rank on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = -1
    local_world_size: int = 1

    @property
    def distributed(self) -> bool:
        """True when a launcher started (or emulates) a process group, even of one process."""
        return self.local_rank != -1


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {name}={value!r} is not an integer; unset it or fix the "
                                 "launcher command that sets it") from None
    return None


def _slurm_tasks_per_node() -> int | None:
    """SLURM writes tasks per node as ``"4"`` or ``"4(x2)"`` (4 tasks on each of 2 nodes); the count comes first."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = os.environ.get(name, "")
        digits = value.split("(")[0].split(",")[0]
        if digits.isdigit():
            return int(digits)
    return None


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``"gpu[03-05,09],cpu1"`` -> ``"gpu03"``), for ``MASTER_ADDR``."""
    first = nodelist.strip()
    depth = 0
    for i, char in enumerate(first):
        depth += char == "["
        depth -= char == "]"
        if char == "," and depth == 0:
            first = first[:i]
            break
    if "[" not in first:
        return first
    prefix, _, ranges = first.partition("[")
    return prefix + ranges.rstrip("]").split(",")[0].split("-")[0]


def _slurm_env() -> tuple[int, int, int | None] | None:
    """(rank, world, local rank) of a process started by ``srun`` directly (no torchrun in between)."""
    if "SLURM_PROCID" not in os.environ:
        return None
    # Only srun's job steps set SLURM_STEP_NUM_TASKS; the batch script itself (one process) also has SLURM_PROCID
    # and SLURM_NTASKS, and reading those there would wait forever for processes that were never started.
    world = _int_env("SLURM_STEP_NUM_TASKS")
    if world is None:
        return None
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if world > 1 and "MASTER_ADDR" not in os.environ and nodelist:
        os.environ["MASTER_ADDR"] = first_slurm_host(nodelist)
    return _int_env("SLURM_PROCID") or 0, world, _int_env("SLURM_LOCALID")


def _mpi_env() -> tuple[int, int, int | None] | None:
    """(rank, world, local rank) under ``mpirun`` (OpenMPI), as used by ``deepspeed --launcher openmpi``."""
    world = _int_env("OMPI_COMM_WORLD_SIZE")
    if world is None:
        return None
    return _int_env("OMPI_COMM_WORLD_RANK") or 0, world, _int_env("OMPI_COMM_WORLD_LOCAL_RANK")


def read_launch_env(local_rank_arg: int = -1) -> LaunchEnv:
    """Read rank and world size from the environment (torchrun, deepspeed, accelerate, SLURM, MPI, notebook).

    * torchrun / ``python -m torch.distributed.run``, ``accelerate launch`` and the ``deepspeed`` launcher set
      ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (and ``LOCAL_WORLD_SIZE`` or DeepSpeed's ``LOCAL_SIZE``);
    * the legacy ``torch.distributed.launch`` passes ``--local_rank`` (``local_rank_arg``); the environment wins
      when both are present;
    * ``srun`` without torchrun: ``SLURM_PROCID`` / ``SLURM_STEP_NUM_TASKS`` /
      ``SLURM_LOCALID``; ``MASTER_ADDR`` defaults to the first host of ``SLURM_JOB_NODELIST``;
    * ``mpirun``: ``OMPI_COMM_WORLD_RANK`` / ``_SIZE`` / ``_LOCAL_RANK``;
    * a notebook emulating a launcher (``RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=...``) gives a
      ``distributed`` environment of one process, which trains like a plain single process.
    """
    local_rank = _int_env("LOCAL_RANK")
    rank = _int_env("RANK")
    world = _int_env("WORLD_SIZE")
    if rank is None and world is None:
        found = _slurm_env() or _mpi_env()
        if found is not None:
            rank, world, local_rank = found
    if local_rank is None:
        local_rank = local_rank_arg
    if local_rank == -1 and world is None and rank is None:
        return LaunchEnv()
    world = world or 1
    local_world = _int_env("LOCAL_WORLD_SIZE", "LOCAL_SIZE") or _slurm_tasks_per_node() or world
    if rank is None:
        rank = max(local_rank, 0)
    if local_rank == -1:
        local_rank = rank % local_world
    return LaunchEnv(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world)


def resolve_device(*, use_cpu: bool, local_rank: int) -> "torch.device":
    """The device this process trains on: its CUDA device under a launcher, else cuda:0, else MPS, else CPU."""
    if use_cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", max(local_rank, 0))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def default_backend(device: "torch.device") -> str:
    """``nccl`` for CUDA devices, ``gloo`` otherwise."""
    return "nccl" if device.type == "cuda" else "gloo"


def process_group_backend(device: "torch.device", backend: str | None = None) -> str:
    """The ``init_process_group`` backend string: ``backend`` (``ddp_backend``) or :func:`default_backend`, with
    ``nccl`` widened to ``cuda:nccl,cpu:gloo`` so that collectives on CPU tensors (FSDP ``offload``: CPU shards, DCP
    metadata) have a backend too, as accelerate creates it (``PartialState``: ``"cuda:nccl,cpu:gloo"`` for FSDP
    with CPU offload or full state dicts)."""
    chosen = backend or default_backend(device)
    return "cuda:nccl,cpu:gloo" if chosen == "nccl" else chosen


def init_process_group(env: LaunchEnv, device: "torch.device", *, backend: str | None = None,
                       timeout_s: int = 1800) -> bool:
    """Create the default process group when a launcher started this process; True when one exists.

    Idempotent: an existing group (made by the user, DeepSpeed or an earlier Trainer) is kept.
    """
    if not env.distributed or not dist.is_available():
        return False
    if dist.is_initialized():
        return True
    check_rendezvous_env(env)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with RendezvousWatch(env, timeout_s):
        dist.init_process_group(backend=process_group_backend(device, backend), rank=env.rank,
                                world_size=env.world_size, timeout=timedelta(seconds=timeout_s))
    close_process_group_at_exit()
    return True


def _single_node_mpi() -> bool:
    """``mpirun`` on one node: its ranks can meet on 127.0.0.1 without a ``MASTER_ADDR``."""
    world, local = _int_env("OMPI_COMM_WORLD_SIZE"), _int_env("OMPI_COMM_WORLD_LOCAL_SIZE")
    return world is not None and world == local


def check_rendezvous_env(env: LaunchEnv) -> None:
    """Refuse at once a launch environment that would wait for peers nothing started.

    Every launcher of several processes (torchrun, ``accelerate launch``, the ``deepspeed`` launcher, the legacy
    ``torch.distributed.launch``) sets ``MASTER_ADDR``; ``srun`` implies it (the first host of the node list, filled
    by :func:`read_launch_env`) and so does ``mpirun`` on one node. ``WORLD_SIZE``/``RANK`` without it are a leftover
    (a shell a launcher started, a notebook): the rendezvous would wait up to ``ddp_timeout`` for ranks that never
    come.
    """
    if env.world_size <= 1 or os.environ.get("MASTER_ADDR") or _single_node_mpi():
        return
    found = ", ".join(f"{name}={os.environ[name]}" for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "SLURM_PROCID",
                                                              "OMPI_COMM_WORLD_SIZE") if name in os.environ)
    raise RuntimeError(
        f"incomplete launch environment: {found} ask for {env.world_size} processes but MASTER_ADDR is not set, so "
        f"this process would wait for peers that nothing started. Launch with a launcher that starts them all and "
        f"sets MASTER_ADDR/MASTER_PORT (torchrun --nproc_per_node={env.world_size} script.py), set MASTER_ADDR and "
        f"MASTER_PORT to rank 0's host and a free port if you start every rank yourself, or unset WORLD_SIZE, RANK "
        f"and LOCAL_RANK to train in one process.")


class RendezvousWatch:
    """While the process group forms, say on stderr who waits for whom, after ``first_s`` and then every
    ``every_s`` seconds: a rendezvous waiting for a rank that never comes is otherwise silent until ``ddp_timeout``."""

    def __init__(self, env: LaunchEnv, timeout_s: float, *, first_s: float = 5.0, every_s: float = 30.0,
                 extension_builds: bool = False) -> None:
        self.env, self.timeout_s, self.first_s, self.every_s = env, timeout_s, first_s, every_s
        self.extension_builds = extension_builds  # a rank may be compiling an op (DeepSpeed): say so when it is
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="trainwell-rendezvous-watch", daemon=True)

    def message(self, waited_s: float) -> str:
        """The report after ``waited_s`` seconds of waiting."""
        address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        world = self.env.world_size
        if self.env.rank == 0:
            others = "rank 1" if world == 2 else f"ranks 1 to {world - 1}"
            who = f"rank 0 hosts the rendezvous at {address} and waits for {others} (at least one has not joined)"
        else:
            who = f"rank {self.env.rank} waits for rank 0 at {address} (not reachable or not started yet)"
        build = None
        if self.extension_builds:
            build = describe_build_locks()
        if build is not None:  # not a rendezvous problem: the address question would mislead
            return f"trainwell: {who}: {waited_s:.0f} s so far; {build}"
        return (f"trainwell: {who}: {waited_s:.0f} s so far, giving up after {self.timeout_s:.0f} s (ddp_timeout). "
                f"Are all {world} processes started with the same MASTER_ADDR/MASTER_PORT?")

    def _watch(self) -> None:
        start = time.monotonic()
        wait = self.first_s
        while not self._done.wait(wait):
            print(self.message(time.monotonic() - start), file=sys.stderr, flush=True)
            wait = self.every_s

    def __enter__(self) -> "RendezvousWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


_EXIT_BARRIER_TIMEOUT_S = 60.0
_close_registered = False


def close_process_group_at_exit() -> None:
    """Close the process groups when the interpreter exits; for a default group trainwell itself created.

    A process that leaves with gloo groups alive has their threads (``pt_gloo_runloop``, ``gloo_tcp_loop``) torn
    down while the interpreter finalizes, and a rank can then abort ("terminate called without an active
    exception", SIGABRT) after a run that succeeded. At exit the ranks first meet on the store (bounded by a
    timeout, so a peer that died cannot hold the exit up for long; skipped when leaving on an unhandled exception),
    then each destroys its groups and drops what still references them (:func:`destroy_process_group`), also when
    the script already destroyed the default group itself.
    """
    global _close_registered
    if _close_registered:
        return

    atexit.register(_close_process_group)
    _close_registered = True


def destroy_process_group() -> bool:
    """Destroy every process group and end their threads now (``Trainer.end``, exit); True when a default group
    existed.

    ``dist.destroy_process_group()`` shuts every group down, but a gloo group's threads only end when the group
    object is freed, and objects outside torch's registry keep destroyed groups alive: a ``DeviceMesh`` (FSDP2's
    mesh, and so every sharded parameter), DeepSpeed's engine, optimizer, parameters and module-level group
    caches. Those are freed only while the interpreter finalizes, with their threads still running. So
    :func:`release_destroyed_groups` follows.
    """
    existed = dist.is_available() and dist.is_initialized()
    if existed:
        note_process_groups()
        dist.destroy_process_group()
    release_destroyed_groups()
    return existed


_noted_groups: list[Any] = []  # the groups alive when last noted: released (and forgotten) once destroyed


def note_process_groups() -> None:
    """Remember the live process groups (the default one, a mesh's, DeepSpeed's), so that
    :func:`release_destroyed_groups` can find what still references them after the script destroyed them itself.
    Called at the end of training and before trainwell destroys the groups."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    for group in list(dist.distributed_c10d._world.pg_map):
        if not any(group is noted for noted in _noted_groups):
            _noted_groups.append(group)


def release_destroyed_groups() -> int:
    """Once no default group exists (so every group is destroyed), replace each reference to a noted process
    group by ``None`` and collect: the groups are freed and their threads end. Returns how many references were
    dropped; without ``torch.distributed`` or while a default group exists, nothing is touched.

    A destroyed group can no longer communicate: what is dropped is a dead handle. The references are found by
    the garbage collector's referrer search (attributes, dicts, lists, closure cells; a tenth of a second on a
    large heap), plus what that search cannot see: a ``DeviceMesh``'s group registry and the ``group=group.WORLD``
    defaults of ``torch.distributed`` and DeepSpeed functions (containers holding only groups and strings are not
    tracked by the collector), and a ``DistributedDataParallel``'s C++ reducer and logger, which are dropped too.
    Where gloo threads still run after that (Linux shows them), a collection follows (a group in a cycle).
    """
    if not dist.is_available() or dist.is_initialized():
        return 0
    groups = list(_noted_groups)
    _noted_groups.clear()
    dropped = _drop_known_references(groups) if groups else 0
    del groups  # the last references: the groups are freed now (and their threads joined)
    if _gloo_threads():
        gc.collect()  # a group in a reference cycle
    return dropped


def _drop_known_references(groups: list[Any]) -> int:
    dropped = 0
    holders: list[Any] = [holder for holder in gc.get_referrers(*groups)
                          if holder is not groups and not isinstance(holder, types.FrameType)]
    mesh_module = sys.modules.get("torch.distributed.device_mesh")
    mesh_type = getattr(mesh_module, "DeviceMesh", None)
    if isinstance(mesh_type, type):  # a mesh's registry dict holds only names and groups: untracked
        holders += [getattr(mesh, "_pg_registry", None) for mesh in gc.get_referrers(mesh_type)
                    if isinstance(mesh, mesh_type)]
    ddp_module = sys.modules.get("torch.nn.parallel.distributed")
    ddp_type = getattr(ddp_module, "DistributedDataParallel", None)
    if isinstance(ddp_type, type):  # its C++ reducer (and the logger that holds it) keep the group past Python
        for ddp in gc.get_referrers(ddp_type):
            if isinstance(ddp, ddp_type):
                dropped += sum(vars(ddp).pop(name, None) is not None for name in ("reducer", "logger"))
    for name, module in list(sys.modules.items()):  # group=group.WORLD defaults: untracked tuples
        if module is not None and (name.startswith("torch.distributed") or name.startswith("deepspeed")):
            holders += [function for function in _module_functions(module) if any(map(_is_group,
                                                                                     function.__defaults__ or ()))]
    return dropped + sum(_drop_in(holder) for holder in holders if holder is not None)


def _module_functions(module: types.ModuleType) -> list[types.FunctionType]:
    functions = []
    with warnings.catch_warnings():  # a deprecated alias warns when looked at (torch.distributed.reduce_op)
        warnings.simplefilter("ignore", FutureWarning)
        for value in list(vars(module).values()):
            if isinstance(value, types.FunctionType):
                functions.append(value)
            elif isinstance(value, type) and value.__module__ == module.__name__:
                functions += [member for member in vars(value).values() if isinstance(member, types.FunctionType)]
    return functions


def _drop_in(holder: Any) -> int:
    """Replace the process groups ``holder`` references (a function's defaults, a cell, a dict, a list, an
    instance's attributes) by ``None``; how many."""
    if isinstance(holder, types.FunctionType):
        defaults = holder.__defaults__ or ()
        holder.__defaults__ = tuple(None if _is_group(v) else v for v in defaults)
        return sum(map(_is_group, defaults))
    if isinstance(holder, types.CellType):
        if _is_group(holder.cell_contents):
            holder.cell_contents = None
            return 1
        return 0
    if not isinstance(holder, (dict, list)):  # an instance: its attributes live in its (managed) dict
        holder = getattr(holder, "__dict__", None)
        if not isinstance(holder, dict):
            return 0  # a tuple or __slots__ keeps its reference
    keys = [key for key, value in (holder.items() if isinstance(holder, dict) else enumerate(holder))
            if _is_group(value)]
    for key in keys:
        holder[key] = None
    return len(keys)


def _gloo_threads() -> int:
    """How many of this process's native threads belong to gloo groups (Linux's ``/proc``; 0 elsewhere)."""
    count = 0
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().strip() in ("pt_gloo_runloop", "gloo_tcp_loop")
        except OSError:  # the thread ended meanwhile
            pass
    return count


def _is_group(value: object) -> bool:
    return isinstance(value, dist.ProcessGroup)


def _close_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        try:
            _meet_at_exit(dist.get_world_size())
        except Exception:  # the store's host already left: close without meeting
            pass
    try:
        destroy_process_group()
    except Exception:  # nothing more can be done at exit
        pass


def _meet_at_exit(world: int) -> None:
    """Sign off on the rendezvous store, then wait (bounded) until every rank has; a failing rank does not wait."""
    if world <= 1:
        return
    store = dist.distributed_c10d._get_default_store()  # private; several ranks only
    store.add("trainwell_exit", 1)
    # Leaving on an unhandled exception (sys.last_value is set by then): peers may be blocked in a collective and
    # never reach the exit, so the failing rank only signs off.
    leaving_on_error = getattr(sys, "last_value", None) is not None
    deadline = time.monotonic() + (0 if leaving_on_error else _EXIT_BARRIER_TIMEOUT_S)
    while time.monotonic() < deadline and store.add("trainwell_exit", 0) < world:
        time.sleep(0.01)


def is_dist() -> bool:
    """True inside an initialised process group."""
    return dist.is_available() and dist.is_initialized()


def get_rank() -> int:
    """Global rank (0 outside a process group)."""
    return dist.get_rank() if is_dist() else 0


def get_world_size() -> int:
    """Number of processes (1 outside a process group)."""
    return dist.get_world_size() if is_dist() else 1


def any_rank(flags: "list[bool]", device: "torch.device | str | None" = None) -> list[bool]:
    """For each flag, whether it is True on any rank (one all-reduce; a collective: every rank must call it).

    Outside a process group the flags themselves. ``device`` is where the tensor lives (CUDA under NCCL).
    """
    if not is_dist():
        return list(flags)

    tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=device or "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [bool(value) for value in tensor.tolist()]


def barrier() -> None:
    """Wait for every rank; a no-op in a single process."""
    if is_dist():
        dist.barrier()


def mean_across_ranks(tensor: "torch.Tensor") -> "torch.Tensor":
    """The mean of ``tensor`` over all ranks (a copy; ``tensor`` itself is unchanged outside a process group)."""
    if not is_dist():
        return tensor.detach().clone()

    reduced = tensor.detach().clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced / dist.get_world_size()


def sum_across_ranks(value: float, device: Any) -> float:
    """``value`` summed over all ranks, as the world size times their mean in float64 (upstream's FLOP count); a
    collective with a process group, ``value`` itself without."""
    if not is_dist():
        return value

    return float(mean_across_ranks(torch.tensor(value, dtype=torch.float64, device=device))) * get_world_size()


_T = TypeVar("_T")


def all_gather_object(obj: _T) -> list[_T]:
    """Every rank's ``obj`` in rank order (``[obj]`` in a single process)."""
    if not is_dist():
        return [obj]

    gathered: list[Any] = [None] * dist.get_world_size()  # the collective puts every rank's obj in its place
    dist.all_gather_object(gathered, obj)
    return gathered
