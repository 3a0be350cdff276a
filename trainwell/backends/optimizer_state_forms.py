"""The forms of a checkpoint's optimizer state: which one a checkpoint holds, whether this run can resume it, and
reading one form as another, so that a checkpoint resumes on another number of processes (elastic resume) or by a
backend that keeps its optimizer state in another form.

A checkpoint holds the optimizer state in one of three forms:

* ``optimizer.pt``: a torch optimizer state dict (one process, DDP, ``sharded_ddp="simple"`` consolidated, and
  ``fsdp`` on one process, which trains on one device);
* ``fsdp_state/``: ``torch.distributed.checkpoint`` (DCP) shards of FSDP2, written by any number of ranks;
* ``latest`` + ``global_step<N>/``: DeepSpeed's engine checkpoint, one ZeRO partition per rank.

The first two are interchangeable, exactly: FSDP2 reads ``optimizer.pt`` and cuts every state tensor into this
rank's shards (:func:`shard_optimizer_state`); one process or DDP reads ``fsdp_state/`` through DCP into whole
tensors (:func:`load_dcp_unsharded`); FSDP2 reads ``fsdp_state/`` of any number of ranks (DCP reshards). DeepSpeed
resumes its own checkpoint on another number of processes through DeepSpeed's universal checkpoint (see
:mod:`trainwell.backends.deepspeed.universal`). DeepSpeed's state and torch's cannot be read by the other:
:func:`check_resumable` refuses that before anything is loaded, naming what differs and the way out.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..checkpoint.layout import OPTIMIZER_NAME, CheckpointError
from ..checkpoint.rng import saved_rng_files
# torch.distributed.checkpoint and .tensor load in the functions that use them: about a second of imports that
# only sharded optimizer states need.

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

logger = logging.getLogger(__name__)

FSDP_STATE_DIR = "fsdp_state"  # the folder of FSDP's DCP shards in a checkpoint (backends.fsdp writes it)


@dataclass(frozen=True)
class SavedOptimizer:
    """The form of a checkpoint's optimizer state (``"torch"``, ``"dcp"``, ``"deepspeed"`` or ``"none"``) and the
    number of processes that wrote the checkpoint (None when it does not say)."""

    form: str
    world_size: int | None


def deepspeed_shards(folder: Path) -> list[Path]:
    """The ZeRO optimizer partitions of the DeepSpeed checkpoint in ``folder`` (its ``latest`` tag), rank order."""
    latest = folder / "latest"
    if not latest.is_file():
        return []
    step = folder / latest.read_text(encoding="utf-8").strip()
    shards = {}
    for path in step.glob("*zero_pp_rank_*_mp_rank_00_optim_states.pt"):
        rank = path.name.split("zero_pp_rank_", 1)[1].split("_", 1)[0]
        if rank.isdigit():
            shards[int(rank)] = path
    return [shards[r] for r in sorted(shards)]


def saved_optimizer(folder: str | Path) -> SavedOptimizer:
    """What holds the optimizer state of the checkpoint ``folder``, and how many processes wrote it."""
    folder = Path(folder)
    rng = saved_rng_files(folder)
    world = max(rng) + 1 if rng else None
    if (folder / "latest").is_file():
        shards = deepspeed_shards(folder)
        return SavedOptimizer("deepspeed", len(shards) or world)
    if (folder / FSDP_STATE_DIR / ".metadata").is_file():
        return SavedOptimizer("dcp", world)
    if (folder / OPTIMIZER_NAME).is_file():
        return SavedOptimizer("torch", world)
    return SavedOptimizer("none", world)


def _weights_only_restart(folder: Path) -> str:
    return (f"or restart from the weights only: load {folder / 'model.safetensors'} into the model (for a ZeRO-3 "
            f"checkpoint the fp32 master weights: `trainwell zero-to-fp32 {folder} OUT_DIR`) and train with "
            "resume_from_checkpoint=None (the optimizer state, schedule and data position start over)")


def check_resumable(folder: str | Path, *, deepspeed: bool, world_size: int) -> SavedOptimizer:
    """Raise ValueError, before anything is loaded, when this run cannot resume the optimizer state of ``folder``
    exactly: a DeepSpeed checkpoint resumed without DeepSpeed, or a torch/FSDP one resumed with DeepSpeed.

    ``deepspeed``: whether this run trains with DeepSpeed; ``world_size``: its number of processes. Returns what
    the checkpoint holds (the resize itself is handled by the backends).
    """
    folder = Path(folder)
    saved = saved_optimizer(folder)
    written = f"{saved.world_size} process(es)" if saved.world_size else "an unknown number of processes"
    if saved.form == "deepspeed" and not deepspeed:
        raise ValueError(
            f"resume_from_checkpoint={str(folder)!r}: the checkpoint was written by DeepSpeed ({written}) but this "
            f"run ({world_size} process(es)) trains without DeepSpeed: DeepSpeed's partitioned optimizer state "
            "cannot be read into a torch optimizer. Resume with the same `deepspeed` config (on any number of "
            f"processes), {_weights_only_restart(folder)}")
    if saved.form in ("torch", "dcp") and deepspeed:
        what = "FSDP's sharded state (fsdp_state/)" if saved.form == "dcp" else "a torch optimizer.pt"
        raise ValueError(
            f"resume_from_checkpoint={str(folder)!r}: the checkpoint was written without DeepSpeed ({written}; "
            f"{what}) but this run trains with DeepSpeed, which resumes only its own engine checkpoint. Resume "
            f"without `deepspeed` (one process, DDP or FSDP, any number of processes), {_weights_only_restart(folder)}")
    return saved


def read_optimizer_file(path: Path) -> Any:
    """The torch optimizer state dict saved at ``path`` (an ``optimizer.pt``), read on the CPU with
    ``weights_only=True``; raises CheckpointError when the file cannot be read (truncated or corrupt)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, ValueError, OSError) as err:
        raise CheckpointError(f"{path}: cannot read the optimizer state ({err}); the file is truncated or "
                              "corrupt") from err


def load_dcp(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path, what: str) -> None:
    """Read the DCP checkpoint at ``path`` (an ``fsdp_state/`` folder) into ``model`` and ``optimizer``, in the form
    they hold their tensors (sharded or whole): ``get_state_dict``, ``dcp.load``, ``set_state_dict``.

    Raises CheckpointError ``"{path}: cannot read {what} ({DCP's error})"`` when DCP cannot read it. Without a
    process group DCP warns that it loads in one process: that is intended, and the warning is filtered out.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_state, "optimizer": optim_state}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
            dcp.load(state, checkpoint_id=str(path))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: B036 - DCP's CheckpointException derives from BaseException
        raise CheckpointError(f"{path}: cannot read {what} ({err})") from err
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def load_dcp_unsharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> None:
    """Read FSDP's ``fsdp_state/`` (any number of shards) into a model and optimizer that hold whole tensors (one
    process, or every rank of DDP); raises CheckpointError when DCP cannot read it."""
    load_dcp(model, optimizer, Path(folder) / FSDP_STATE_DIR, "the sharded FSDP state into this unsharded model")
    logger.info("Read the sharded FSDP state of %s (model and optimizer) into whole tensors", folder)


def shard_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any], source: Path) -> dict[str, Any]:
    """A torch optimizer state dict of whole tensors (``optimizer.pt`` of one process) with every state tensor of a
    sharded (``DTensor``) parameter cut into this rank's shard, ready for ``optimizer.load_state_dict``.

    Raises CheckpointError when the parameter groups or the tensor shapes do not match ``optimizer``'s.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    groups = state.get("param_groups") if isinstance(state, dict) else None
    if groups is None or not isinstance(state.get("state"), dict):
        raise CheckpointError(f"{source}: not an optimizer state dict (no 'param_groups' / 'state')")
    saved_sizes = [len(g["params"]) for g in groups]
    current_sizes = [len(g["params"]) for g in optimizer.param_groups]
    if saved_sizes != current_sizes:
        raise CheckpointError(f"{source}: optimizer parameter groups have sizes {saved_sizes} in the checkpoint but "
                              f"{current_sizes} now; build the optimizer for the same model and parameter groups")
    params = {index: param for saved_group, group in zip(groups, optimizer.param_groups)
              for index, param in zip(saved_group["params"], group["params"])}
    sharded: dict[Any, dict[str, Any]] = {}
    for index, param_state in state["state"].items():
        param = params.get(index)
        if param is None:
            raise CheckpointError(f"{source}: optimizer state for parameter {index}, which no parameter group holds")
        sharded[index] = {key: _shard_like(value, param, distribute_tensor, DTensor, f"{source}: {key} of {index}")
                          for key, value in param_state.items()}
    return {"state": sharded, "param_groups": groups}


def _shard_like(value: Any, param: torch.Tensor, distribute_tensor: Any, dtensor: type[DTensor], what: str) -> Any:
    if not (isinstance(param, dtensor) and isinstance(value, torch.Tensor) and value.dim() > 0):
        return value  # a scalar (Adam's step) or an unsharded parameter: as saved
    if tuple(value.shape) != tuple(param.shape):
        raise CheckpointError(f"{what}: shape {tuple(value.shape)} in the checkpoint, {tuple(param.shape)} now")
    value = value.to(device=param.device)
    return distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None)
