"""Fully Sharded Data Parallel with torch FSDP2 (``torch.distributed.fsdp.fully_shard``).

Parameters, gradients and optimizer state are sharded over the ranks (``DTensor`` parameters); each wrapped unit
all-gathers its parameters for its forward and backward and reduce-scatters its gradients.

``--fsdp`` options:

* ``full_shard``: ``reshard_after_forward=True`` (ZeRO-3); ``shard_grad_op``: ``False`` (ZeRO-2: parameters stay
  gathered between forward and backward);
* ``hybrid_shard`` / ``hybrid_shard_zero2``: a 2-D mesh, replicated across nodes and sharded inside each node
  (``LOCAL_WORLD_SIZE`` ranks); on one node it is the same as ``full_shard`` / ``shard_grad_op``;
* ``no_shard``: handled by :class:`~trainwell.backends.ddp.DDPBackend` (plain DDP is what it means);
* ``offload``: ``CPUOffloadPolicy`` (sharded parameters, gradients and optimizer step on the CPU);
* ``auto_wrap``: every module whose class name is in ``fsdp_config["transformer_layer_cls_to_wrap"]`` (default: the
  model's ``_no_split_modules``), or with ``min_num_params``, every submodule holding at least that many parameters
  not already in a wrapped submodule, becomes its own FSDP unit; the root is always one.

``fsdp_config``: ``activation_checkpointing`` (recompute the blocks' activations in backward),
``forward_prefetch`` (each unit prefetches the next one's all-gather in forward), ``cpu_ram_efficient_loading``
and ``sync_module_states`` (rank 0's weights are broadcast to every rank after sharding: every rank trains from
rank 0's initialisation). The keys that name FSDP1 choices FSDP2 makes by design are checked by
:func:`check_fsdp_config`: ``backward_prefetch`` ``BACKWARD_PRE`` (FSDP2 prefetches the next unit's all-gather
before the current unit's backward; ``BACKWARD_POST`` / ``NO_PREFETCH`` are refused), ``use_orig_params`` true
(FSDP2 shards each original parameter as a DTensor; false, FSDP1's flat parameters, is refused),
``state_dict_type`` ``FULL_STATE_DICT`` or ``SHARDED_STATE_DICT`` (a checkpoint always holds both the sharded state
``fsdp_state/`` and the consolidated weights; ``LOCAL_STATE_DICT``, FSDP1's flat shards, is refused);
``limit_all_gathers`` is accepted: FSDP2 bounds the in-flight all-gathers by design. ``bf16`` becomes a ``MixedPrecisionPolicy`` (parameters cast for compute, gradients
reduced in fp32) with bf16 autocast on top, as accelerate runs it.
``fp16`` keeps fp32 shards: autocast computes in fp16 and a ``ShardedGradScaler`` scales the loss
(upstream 4.x's ``--fp16 --sharded_ddp zero_dp_2``).

Checkpoints: :meth:`FSDPBackend.save` writes the sharded model and optimizer state with
``torch.distributed.checkpoint`` into ``<checkpoint>/fsdp_state`` (every rank writes its shard: fast, but the
folder must be on a file system that every rank sees); the checkpoint also holds the consolidated
``model.safetensors`` gathered by :meth:`full_state_dict`. ``model.load_state_dict`` accepts full (unsharded)
tensors: they are cut into this rank's shards. DCP reshards ``fsdp_state`` for any number of ranks; a checkpoint of
``fsdp`` on one process (which trains on one device and writes ``optimizer.pt``) is cut into shards the same way
(:mod:`trainwell.backends.optimizer_state_forms`).
"""

from __future__ import annotations

import itertools
import logging
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, cast

import torch
from torch import nn

from ..checkpoint.layout import OPTIMIZER_NAME, CheckpointError
from ..runtime.precision import Precision
from ..utils.model_utils import activation_checkpointing, enable_gradient_checkpointing
from .base import Capabilities, prepared
from .single import _NULL, SingleDeviceBackend
from ..checkpoint.stream import tensor_stream
from ..runtime.distributed import get_world_size, read_launch_env, get_rank
from .optimizer_state_forms import FSDP_STATE_DIR, load_dcp, read_optimizer_file, shard_optimizer_state
# torch.distributed.fsdp, .tensor and .checkpoint load in the functions that use them: about a second of imports
# (torch._dynamo) that a run without FSDP does not pay (backends/registry.py imports this module).

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

logger = logging.getLogger(__name__)


def fsdp_options(args: Any) -> set[str]:
    """The words of ``args.fsdp`` as plain strings."""
    value = getattr(args, "fsdp", None) or []
    if isinstance(value, str):
        value = value.split()
    return {getattr(option, "value", option) for option in value}


def _mixed_precision_policy(args: Any) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    # fp16 keeps fp32 sharded parameters and gradients: autocast computes in fp16 and a ShardedGradScaler scales
    # the loss (no fp16 reduce: upstream 4.x's "--fp16 --sharded_ddp zero_dp_2" trains as it did with fairscale).
    if getattr(args, "bf16", False):
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def _flag(value: Any) -> bool:
    return value in (True, "true", "True", "TRUE", 1, "1")


def _policy_name(value: Any) -> str:
    """``"backward_pre"``, ``"BackwardPrefetch.BACKWARD_PRE"``, ``1`` -> ``"BACKWARD_PRE"`` (accelerate's spellings)."""
    text = str(getattr(value, "name", value)).strip().upper().rsplit(".", 1)[-1]
    return {"1": "BACKWARD_PRE", "2": "BACKWARD_POST", "3": "NO_PREFETCH"}.get(text, text)


def check_fsdp_config(config: dict[str, Any]) -> None:
    """Refuse the ``fsdp_config`` values FSDP2 cannot honour, each with the reason and the fix (see module doc)."""
    problems = []
    version = config.get("version", 2)
    if str(version) not in ("1", "2"):  # accelerate's FSDP1 configs map onto FSDP2 (trainwell runs FSDP2 only)
        problems.append(f"version={version!r}: FSDP versions are 1 and 2 (both run on FSDP2); set fsdp_version: 2")
    prefetch = config.get("backward_prefetch")
    if prefetch not in (None, "") and _policy_name(prefetch) != "BACKWARD_PRE":
        problems.append(f"backward_prefetch={prefetch!r}: FSDP2 always prefetches the next unit's all-gather before "
                        "the current unit's backward (BACKWARD_PRE); set fsdp_backward_prefetch: BACKWARD_PRE")
    if "use_orig_params" in config and not _flag(config["use_orig_params"]):
        problems.append("use_orig_params=false: FSDP2 shards each original parameter (FSDP1's flat parameters do "
                        "not exist); set fsdp_use_orig_params: true")
    kind = config.get("state_dict_type")
    if kind not in (None, "") and _policy_name(kind) not in ("FULL_STATE_DICT", "SHARDED_STATE_DICT"):
        problems.append(f"state_dict_type={kind!r}: trainwell's checkpoints hold the sharded state (fsdp_state/) "
                        "and the consolidated weights; FSDP1's local flat shards are not written; set "
                        "fsdp_state_dict_type: SHARDED_STATE_DICT (or FULL_STATE_DICT)")
    if problems:
        raise ValueError("fsdp_config asks for what FSDP2 cannot do:\n  - " + "\n  - ".join(problems))


def _post_order(model: nn.Module) -> list[nn.Module]:
    """Submodules children-first (the root last), so inner units are sharded before the units containing them."""
    order: list[nn.Module] = []
    for child in model.children():
        order.extend(_post_order(child))
    order.append(model)
    return order


def _modules_by_class(model: nn.Module, names: list[str]) -> list[nn.Module]:
    found = [m for m in _post_order(model)[:-1] if type(m).__name__ in names]
    if not found:
        raise ValueError(f"fsdp auto_wrap: no module of class {names} in {type(model).__name__}; set "
                         "fsdp_config['transformer_layer_cls_to_wrap'] to the class name of your layers (e.g. "
                         "'LlamaDecoderLayer') or use fsdp_config['min_num_params']")
    return found


def _modules_by_size(model: nn.Module, min_num_params: int) -> list[nn.Module]:
    """Every submodule with at least ``min_num_params`` parameters outside the submodules already chosen."""
    chosen: list[nn.Module] = []
    covered: set[int] = set()
    for module in _post_order(model)[:-1]:
        own = [p for p in module.parameters() if id(p) not in covered]
        if sum(p.numel() for p in own) >= min_num_params:
            chosen.append(module)
            covered.update(id(p) for p in own)
    return chosen


def units_to_wrap(model: nn.Module, options: set[str], config: dict[str, Any]) -> list[nn.Module]:
    """The submodules that become FSDP units of their own under ``auto_wrap`` (children first; root excluded)."""
    if "auto_wrap" not in options:
        return []
    names = config.get("transformer_layer_cls_to_wrap") or getattr(model, "_no_split_modules", None)
    if names:
        return _modules_by_class(model, [names] if isinstance(names, str) else list(names))
    min_num_params = int(config.get("min_num_params") or 0)
    if min_num_params > 0:
        return _modules_by_size(model, min_num_params)
    logger.warning("fsdp auto_wrap: neither fsdp_config['transformer_layer_cls_to_wrap'], the model's "
                   "_no_split_modules, nor min_num_params is set; the whole model is one FSDP unit")
    return []


def _shard_full_tensors(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """load_state_dict pre-hook: cut full (unsharded) tensors into this rank's shards of the DTensor parameters."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, current in itertools.chain(module.named_parameters(), module.named_buffers()):
        key = prefix + name
        value = state_dict.get(key)
        if isinstance(current, DTensor) and isinstance(value, torch.Tensor) and not isinstance(value, DTensor):
            value = value.to(device=current.device, dtype=current.dtype)
            state_dict[key] = distribute_tensor(value, current.device_mesh, current.placements, src_data_rank=None)


class FSDPBackend(SingleDeviceBackend):
    """FSDP2 sharding from ``args.fsdp`` / ``args.fsdp_config``; backward and step as in one process."""

    def __init__(self, args: Any, device: torch.device, precision: Precision) -> None:
        super().__init__(device, precision, n_gpu=1, place_model_on_device=True)
        self.args = args
        self.options = fsdp_options(args)
        self.config = dict(getattr(args, "fsdp_config", None) or {})
        if self.config.get("xla"):
            raise ValueError("fsdp_config['xla']=True: PyTorch/XLA FSDP is not supported by trainwell; remove it")
        check_fsdp_config(self.config)
        if self.config.get("activation_checkpointing") and activation_checkpointing(args)[0]:
            raise ValueError("fsdp_config['activation_checkpointing'] and activation_checkpointing=True (or "
                             "gradient_checkpointing=True) both ask for activation checkpointing; keep only one of them")
        self.mp_policy = _mixed_precision_policy(args)
        if self.scaler.is_enabled():  # fp16: found-inf is agreed across ranks, gradients are sharded DTensors
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = precision.scaler = ShardedGradScaler(device.type)
        self.caps = Capabilities(owns_precision=self.mp_policy is not None, sharded_state=True, async_checkpoint=True,
                                 engine_needs_shared_folder=True, places_model=True)
        self._sharded = False
        self._stager: Any = None  # async_save's copy of the shards to host memory

    # -- model -------------------------------------------------------------------------------------------------
    def device_mesh(self) -> Any:
        """1-D mesh over all ranks, or (nodes x ranks per node) for ``hybrid_shard``."""
        from torch.distributed.device_mesh import init_device_mesh

        world = get_world_size()
        if not self.options & {"hybrid_shard", "hybrid_shard_zero2"}:
            return init_device_mesh(self.device.type, (world,))

        per_node = read_launch_env(getattr(self.args, "local_rank", -1)).local_world_size
        if per_node < 1 or world % per_node:
            raise ValueError(f"fsdp hybrid_shard needs the same number of processes on every node: world size "
                             f"{world} is not a multiple of LOCAL_WORLD_SIZE={per_node}")
        return init_device_mesh(self.device.type, (world // per_node, per_node),
                                mesh_dim_names=("dp_replicate", "dp_shard"))

    def shard_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``fully_shard`` for every unit."""
        from torch.distributed.fsdp import CPUOffloadPolicy

        kwargs: dict[str, Any] = {"mesh": self.device_mesh(),
                                  "reshard_after_forward": not self.options & {"shard_grad_op", "hybrid_shard_zero2"}}
        if self.mp_policy is not None:
            kwargs["mp_policy"] = self.mp_policy
        if "offload" in self.options:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
        return kwargs

    def prepare_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Shard ``model`` in place (its units, then the root); evaluation before training uses it as it is."""
        if self._sharded and model is self.model:
            return model
        if not training:
            model = model.to(self.device)
            self.model = self.wrapped = model
            return model
        if "offload" not in self.options:
            model = model.to(self.device)
        full = self._rank0_weights(model)
        if self.config.get("activation_checkpointing"):
            enable_gradient_checkpointing(model, activation_checkpointing(self.args)[1])
        self._shard(model)
        if full is not None:
            self._broadcast_rank0_weights(model, full)
        model.register_load_state_dict_pre_hook(_shard_full_tensors)
        self.model = self.wrapped = model
        self._sharded = True
        return model

    def _shard(self, model: nn.Module) -> None:
        from torch.distributed.fsdp import fully_shard

        kwargs = self.shard_kwargs()
        units = units_to_wrap(model, self.options, self.config)
        for unit in units:
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)
        if callable(getattr(model, "generate", None)):
            # FSDP2 gathers the parameters around forward only; generate (predict_with_generate) calls submodules
            # directly (T5's encoder) and would meet sharded DTensors: upstream's Trainer registers it for FSDP
            # (torch.distributed.fsdp.register_fsdp_forward_method(self.model, "generate"))
            from torch.distributed.fsdp import register_fsdp_forward_method

            register_fsdp_forward_method(model, "generate")
        if self.config.get("forward_prefetch") in (True, "true", "True") and len(units) > 1:
            for unit, following in zip(units, units[1:]):
                cast("FSDPModule", unit).set_modules_to_forward_prefetch([cast("FSDPModule", following)])
        logger.info("FSDP: %d unit(s) + root, options %s", len(units), sorted(self.options))

    def _rank0_weights(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Rank 0's weights (``{}`` on the other ranks) when they are to be broadcast after sharding, else None."""
        if not (_flag(self.config.get("cpu_ram_efficient_loading")) or _flag(self.config.get("sync_module_states"))):
            return None

        return {k: v.detach().cpu() for k, v in model.state_dict().items()} if get_rank() == 0 else {}

    def _broadcast_rank0_weights(self, model: nn.Module, full: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))

    # -- the step ----------------------------------------------------------------------------------------------
    def autocast(self) -> AbstractContextManager[Any]:
        """Autocast in the run's dtype, over the fp32 shards (fp16) or on top of the bf16 ``MixedPrecisionPolicy``
        (upstream: accelerate's ``native_amp`` wraps the FSDP model's forward in autocast for bf16 too)."""
        return self.precision.autocast()

    def no_sync(self, sync: bool) -> AbstractContextManager[Any]:
        """Keep gradients unsharded and unreduced on accumulation micro-steps (one reduce-scatter per step)."""
        if sync or not self._sharded:
            return _NULL
        return self._without_gradient_sync()

    @contextmanager
    def _without_gradient_sync(self) -> Iterator[None]:
        model = cast("FSDPModule", self.model)  # sharded (no_sync asks only then): fully_shard made it an FSDPModule
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor | None:
        """Unscale (fp16) then clip the sharded gradients by their global norm; returns that norm as a plain tensor.

        As upstream (accelerate's ``clip_grad_norm_`` calls ``unscale_gradients()`` first) and as one device does:
        the ``ShardedGradScaler`` records the unscale, so ``scaler.step`` in :meth:`optimizer_step` does not unscale
        again."""
        self.scaler.unscale_(prepared(self.optimizer, "optimizer"))  # a disabled scaler (bf16, fp32) does nothing
        norm = torch.nn.utils.clip_grad_norm_(prepared(self.model, "model").parameters(), max_norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    # -- state -------------------------------------------------------------------------------------------------
    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The consolidated weights on the CPU (collective: every rank must call it).

        They are gathered on every saving rank (rank 0, or each node's first with ``save_on_each_node``); the
        others get ``{}``. None before the model is sharded (its own ``state_dict()`` is then complete).
        """
        if not self._sharded:
            return None
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        on_each_node = bool(getattr(self.args, "save_on_each_node", False))
        options = StateDictOptions(full_state_dict=True, cpu_offload=not on_each_node)
        state: dict[str, Any] = get_model_state_dict(prepared(self.model, "model"), options=options)
        if not on_each_node:
            return state
        return {k: v.cpu() for k, v in state.items()} if self.args.should_save else {}

    def stream_state_dict(self, *, model_save: bool) -> Any:
        """The consolidated weights gathered one tensor at a time (``DTensor.full_tensor``, a collective), kept on
        the saving ranks only: the peak host memory of a save is one tensor, not the model. None before sharding."""
        if not self._sharded:
            return None
        from torch.distributed.tensor import DTensor

        keep = bool(self.args.should_save)

        def gather(obj: Any) -> torch.Tensor | None:
            full = obj.full_tensor() if isinstance(obj, DTensor) else obj
            return full.detach().to("cpu", copy=True) if keep else None

        weights = prepared(self.model, "model").state_dict(keep_vars=True)
        return tensor_stream(iter(weights.items()), gather, lambda obj: obj.shape)

    def save(self, folder: Path) -> None:
        """Write the sharded model and optimizer state into ``folder/fsdp_state`` (collective)."""
        if not self._sharded or getattr(self.args, "save_only_model", False):
            return
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optim_state = get_state_dict(prepared(self.model, "model"), prepared(self.optimizer, "optimizer"))
        dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(Path(folder) / FSDP_STATE_DIR))

    def async_engine_snapshot(self) -> Callable[[Path, Any], None] | None:
        """``async_save``: this rank's shards of the model and optimizer state copied to host memory now, and the
        function that writes them as :meth:`save` does (DCP), with DCP's collectives on the saver's group."""
        if not self._sharded or getattr(self.args, "save_only_model", False):
            return None
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        from torch.distributed.checkpoint.staging import BlockingAsyncStager

        if self._stager is None:  # reused host buffers (pinned) when the shards live on a GPU
            self._stager = BlockingAsyncStager(cache_staged_state_dict=torch.cuda.is_available())
        model_state, optim_state = get_state_dict(prepared(self.model, "model"), prepared(self.optimizer, "optimizer"))
        staged = self._stager.stage({"model": model_state, "optimizer": optim_state})

        def write(folder: Path, group: Any) -> None:
            dcp.save(staged, checkpoint_id=str(Path(folder) / FSDP_STATE_DIR), process_group=group)

        return write

    def load(self, folder: Path) -> None:
        """Read what :meth:`save` wrote (or a one-process ``optimizer.pt``, resharded); raises CheckpointError when
        neither is there (an interrupted save)."""
        if not self._sharded:
            return
        path = Path(folder) / FSDP_STATE_DIR
        if not (path / ".metadata").is_file() and (Path(folder) / OPTIMIZER_NAME).is_file():
            self._load_unsharded_optimizer(Path(folder) / OPTIMIZER_NAME)  # one process wrote it (elastic resume)
            return
        if not (path / ".metadata").is_file():
            if getattr(self.args, "save_only_model", False):
                logger.warning("%s has no %s (save_only_model=True); the optimizer starts fresh", folder,
                               FSDP_STATE_DIR)
                return
            raise CheckpointError(f"{path}: the sharded FSDP state (model and optimizer) is missing from the "
                                  "checkpoint (the save was interrupted); resume from an earlier checkpoint")
        load_dcp(prepared(self.model, "model"), prepared(self.optimizer, "optimizer"), path, "the sharded FSDP state")

    def _load_unsharded_optimizer(self, path: Path) -> None:
        """``optimizer.pt`` of a one-process run (whole tensors), cut into this rank's shards; the model weights came
        from ``model.safetensors`` (see :mod:`trainwell.backends.optimizer_state_forms`)."""
        state = read_optimizer_file(path)
        optimizer = prepared(self.optimizer, "optimizer")
        optimizer.load_state_dict(shard_optimizer_state(optimizer, state, path))
        logger.info("Resharded the optimizer state of %s (written by one process) over the FSDP ranks", path)
