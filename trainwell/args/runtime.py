"""The runtime properties of ``TrainingArguments``: device, GPUs, world size and ranks, resolved lazily.

Read from the launcher's environment (:mod:`trainwell.runtime.distributed`) the first time one is asked for and
cached outside the dataclass fields (not in ``to_dict``/``repr``/pickles); constructing arguments touches nothing.
"""

from __future__ import annotations

import contextlib
import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Iterator

from ..utils.logging_utils import passive_level
from ..utils.option_enums import ParallelMode
from .field_types import FieldTypes
from .validate import trainer_log_levels

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


class RuntimeProperties(FieldTypes):
    """What the process and device are, as properties of :class:`~trainwell.TrainingArguments`."""

    def _runtime(self) -> tuple[Any, torch.device, int]:
        """(LaunchEnv, device, n_gpu), resolved once from the launcher's environment; no process group."""
        cached = self.__dict__.get("_runtime_cache")
        if cached is None:
            from ..runtime.distributed import read_launch_env, resolve_device

            env = read_launch_env(self.local_rank)
            device = resolve_device(use_cpu=self.use_cpu, local_rank=env.local_rank)
            if device.type != "cuda":
                n_gpu = 0
            elif env.distributed:
                n_gpu = 1
            else:
                import torch

                n_gpu = torch.cuda.device_count()
            cached = self.__dict__["_runtime_cache"] = (env, device, n_gpu)
        return cached

    def _set_up_runtime(self) -> tuple[Any, torch.device, int]:
        """:meth:`_runtime` with the distributed state set up, once, at the first ``device``/``n_gpu``/
        ``main_process_first`` use, as upstream's ``TrainingArguments._setup_devices`` (accelerate's
        ``PartialState``): under a launcher of several processes the process group exists and each rank's CUDA
        device is current, so ``main_process_first()`` before any Trainer waits for the main process and a bare
        ``"cuda"`` in the user's script is this rank's GPU, not GPU 0. The ranks, ``world_size`` and the logging
        properties read the launcher's environment only. DeepSpeed creates its own group when its engine is built
        (``deepspeed.init_distributed``)."""
        runtime = self._runtime()
        if not self.__dict__.get("_devices_set_up"):
            self._setup_distributed(*runtime[:2])  # (raises again at the next use when the launch is incomplete)
            self.__dict__["_devices_set_up"] = True
            if runtime[0].distributed:  # accelerate's PartialState adopts the group (made with the arguments in one
                from ..runtime.accelerate_env import ensure_partial_state  # process, see ensure_partial_state)

                ensure_partial_state(self)
        return runtime

    def _setup_distributed(self, env: Any, device: torch.device) -> None:
        from ..runtime.distributed import init_process_group

        if env.distributed and env.world_size > 1 and not getattr(self, "deepspeed", None):
            init_process_group(env, device, backend=getattr(self, "ddp_backend", None),
                               timeout_s=int(getattr(self, "ddp_timeout", 1800)))  # sets the CUDA device first
        elif device.type == "cuda":  # upstream: torch.cuda.set_device(cuda:0) in one process, the rank's GPU under DS
            import torch

            torch.cuda.set_device(device)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_runtime_cache", None)  # re-resolve on the machine that unpickles
        state.pop("_devices_set_up", None)
        state.pop("hf_deepspeed_config", None)  # process-wide registration, not data
        return state

    @property
    def device(self) -> torch.device:
        """The device this process uses (its first use sets the distributed state up, see :meth:`_set_up_runtime`)."""
        return self._set_up_runtime()[1]

    @property
    def n_gpu(self) -> int:
        """CUDA devices used by this process: 0 on CPU/MPS, 1 under a launcher, all visible ones otherwise."""
        return self._set_up_runtime()[2]

    @property
    def _n_gpu(self) -> int:
        """Upstream's attribute behind ``n_gpu`` (read by code written against it): the same value."""
        return self.n_gpu

    @property
    def parallel_mode(self) -> ParallelMode:
        """DISTRIBUTED under a launcher, NOT_DISTRIBUTED for several GPUs in one process, else NOT_PARALLEL."""
        if self._runtime()[0].distributed:
            return ParallelMode.DISTRIBUTED
        return ParallelMode.NOT_DISTRIBUTED if self.n_gpu > 1 else ParallelMode.NOT_PARALLEL

    @property
    def world_size(self) -> int:
        """Number of processes training together."""
        from ..runtime.distributed import get_world_size, is_dist

        return get_world_size() if is_dist() else self._runtime()[0].world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        from ..runtime.distributed import get_rank, is_dist

        return get_rank() if is_dist() else self._runtime()[0].rank

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return max(self._runtime()[0].local_rank, 0)

    @property
    def distributed_state(self) -> DistributedState:
        """Where this process stands, under the names of accelerate's ``PartialState`` (upstream's attribute of the
        same name): ``distributed_type``, ``num_processes``, ``process_index``, ``device``..."""
        return DistributedState(self)

    @property
    def deepspeed_plugin(self) -> Any:
        """None without ``deepspeed``; else an object with accelerate's ``DeepSpeedPlugin`` attributes that
        libraries read: ``deepspeed_config`` (the config dict), ``zero_stage`` and ``hf_ds_config``."""
        config = self.__dict__.get("hf_deepspeed_config")
        if self.deepspeed is None or config is None:
            return None
        from types import SimpleNamespace

        return SimpleNamespace(deepspeed_config=config.config, zero_stage=config.zero_stage, hf_ds_config=config)

    @property
    def train_batch_size(self) -> int:
        """Samples per forward pass of this process (per-device size times the DataParallel GPUs)."""
        return self.per_device_train_batch_size * max(1, self.n_gpu)

    @property
    def eval_batch_size(self) -> int:
        """Samples per evaluation forward pass of this process."""
        return self.per_device_eval_batch_size * max(1, self.n_gpu)

    @property
    def ddp_timeout_delta(self) -> timedelta:
        """``ddp_timeout`` as a ``timedelta`` for ``init_process_group``."""
        return timedelta(seconds=self.ddp_timeout)

    @property
    def place_model_on_device(self) -> bool | None:
        """Whether the Trainer moves the model to ``device``: None (upstream 5.24's value) lets it decide (not under
        model parallelism, DeepSpeed, FSDP or a half-precision evaluation); a subclass may override it with a bool."""
        return None

    @property
    def should_log(self) -> bool:
        """Whether this process logs: the main process of each node, or only the global main process."""
        return self.local_process_index == 0 if self.log_on_each_node else self.process_index == 0

    @property
    def should_save(self) -> bool:
        """Whether this process writes checkpoints: the global main process, or each node's with save_on_each_node."""
        return self.local_process_index == 0 if self.save_on_each_node else self.process_index == 0

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work") -> Iterator[None]:
        """Run the body on the main process first, then on the others (e.g. dataset preprocessing and caching).

        ``local`` picks the main process of each node instead of the global one. A no-op in one process.
        """
        from ..runtime.distributed import barrier, is_dist

        self._set_up_runtime()  # upstream's reads distributed_state: the process group exists from here
        if self.world_size <= 1 or not is_dist():
            yield
            return
        is_main = (self.local_process_index if local else self.process_index) == 0
        if not is_main:
            logger.debug("%d: waiting for the main process to perform %s", self.process_index, desc)
            barrier()
        try:
            yield
        finally:
            if is_main:
                barrier()

    def get_process_log_level(self) -> int:
        """The log level of this process: log_level on logging processes, log_level_replica on the others.

        "passive" keeps what the user set, on either library's logger (as upstream, which returns transformers'
        verbosity): the ``trainwell`` logger's own level if set, else transformers' verbosity when a script has
        loaded transformers' logging, else WARNING.
        """
        level = trainer_log_levels[self.log_level if self.should_log else self.log_level_replica]
        return passive_level() if level == -1 else level


#: accelerate's ``DistributedType`` values (a str enum there, so these compare equal to its members)
NO, MULTI_CPU, MULTI_GPU, DEEPSPEED, FSDP = "NO", "MULTI_CPU", "MULTI_GPU", "DEEPSPEED", "FSDP"


class DistributedState:
    """accelerate's ``PartialState`` answers for a ``TrainingArguments`` (``args.distributed_state``), read from
    the same lazily resolved launch as the arguments' own properties; it holds nothing of its own."""

    def __init__(self, args: Any) -> None:
        self._args = args

    @property
    def device(self) -> torch.device:
        """The device of this process."""
        return self._args.device

    @property
    def num_processes(self) -> int:
        """Processes training together."""
        return self._args.world_size

    @property
    def process_index(self) -> int:
        """Global rank of this process."""
        return self._args.process_index

    @property
    def local_process_index(self) -> int:
        """Rank of this process on its node."""
        return self._args.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on the first process of the job."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """True on the first process of each node."""
        return self.local_process_index == 0

    @property
    def use_distributed(self) -> bool:
        """True when several processes train together."""
        return self.num_processes > 1

    @property
    def distributed_type(self) -> str:
        """``"DEEPSPEED"``, ``"FSDP"``, ``"MULTI_GPU"``, ``"MULTI_CPU"`` or ``"NO"`` (accelerate's names)."""
        args = self._args
        if args.deepspeed is not None:
            return DEEPSPEED
        if args.fsdp:
            return FSDP
        if self.num_processes > 1:
            return MULTI_GPU if self.device.type == "cuda" else MULTI_CPU
        return MULTI_GPU if args.n_gpu > 1 else NO

    def wait_for_everyone(self) -> None:
        """A barrier across all processes (nothing in one process)."""
        from ..runtime.distributed import barrier

        barrier()
