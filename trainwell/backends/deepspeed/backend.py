"""DeepSpeed: ZeRO stages 0-3, CPU/NVMe offload, fp16/bf16, accumulation and clipping done by the engine.

The training loop stays backend-agnostic; this file maps the :class:`~trainwell.backends.base.Backend` calls onto the
engine:

- ``no_sync(sync)`` tells the engine whether the coming micro-batch ends an accumulation group
  (``set_gradient_accumulation_boundary``), so a short last group of an epoch is handled exactly;
- ``backward(loss)`` is ``engine.backward(loss, scale_wrt_gas=False)`` (the trainer already divided the loss for
  accumulation) followed, on a micro-step inside a group, by ``engine.step()`` (DeepSpeed's bookkeeping; it does not
  update the weights there);
- ``optimizer_step()`` is ``engine.step()`` at the boundary: clipping, the (possibly offloaded) optimizer update, the
  loss-scale update and DeepSpeed's scheduler step; False when fp16 overflowed and the step was skipped;
- the trainer gets thin views of the engine's optimizer and scheduler (their ``step``/``state_dict`` are no-ops: the
  engine steps them, and its own checkpoint holds their state).
"""

from __future__ import annotations

import logging
import os
import copy
import json
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist
from torch import nn

from ...runtime.distributed import (RendezvousWatch, check_rendezvous_env, close_process_group_at_exit,
                                    read_launch_env, get_rank, get_world_size)
from ..base import Capabilities, prepared, WeightsNotGathered
from . import import_deepspeed_module
from .config import DS_TO_TRAINER_SCHEDULER, DeepSpeedConfig
from ...checkpoint.layout import CheckpointError
from ...checkpoint.rng import saved_rng_files
from ...checkpoint.stream import tensor_stream
from ...optim.schedules import get_scheduler
from ..optimizer_state_forms import deepspeed_shards
from .universal import load_resized

logger = logging.getLogger("trainwell.deepspeed")

_NULL = nullcontext()


def import_deepspeed(device: torch.device | None = None) -> Any:
    """Import ``deepspeed``, selecting its CPU accelerator when training on the CPU."""
    return import_deepspeed_module("deepspeed", on_cpu=device is not None and device.type == "cpu",
                                   missing="deepspeed=... needs the DeepSpeed package: pip install "
                                   "trainwell[deepspeed] (or pip install deepspeed)")


def ensure_process_group(device: torch.device, backend: str | None = None) -> None:
    """DeepSpeed needs a process group even for one process: create one (gloo on CPU) when no launcher did."""
    if dist.is_available() and dist.is_initialized():
        return
    env = read_launch_env()
    check_rendezvous_env(env)
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29500")):
        os.environ.setdefault(name, value)  # the notebook emulation of a launcher (DeepSpeed guide)
    deepspeed = import_deepspeed(device)
    with RendezvousWatch(env, 1800, extension_builds=True):  # DeepSpeed's default process-group timeout
        deepspeed.init_distributed(dist_backend=backend or ("nccl" if device.type == "cuda" else "gloo"),
                                   auto_mpi_discovery=False)
    close_process_group_at_exit()


class _OptimizerView:
    """What the trainer and callbacks see of the engine's optimizer: its param groups; stepping is the engine's."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The engine optimizer's parameter groups (learning rates included)."""
        return self._engine.optimizer.param_groups

    @property
    def inner(self) -> Any:
        """The DeepSpeed optimizer itself."""
        return self._engine.optimizer

    def step(self, closure: Any = None) -> None:
        """No-op: ``engine.step()`` steps the optimizer at accumulation boundaries."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        """No-op: the engine clears gradients after its step."""

    def state_dict(self) -> dict[str, Any]:
        """Empty: the optimizer state lives in DeepSpeed's own checkpoint (``global_step*/``)."""
        return {"state": {}, "param_groups": []}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """No-op: restored by ``engine.load_checkpoint``."""


class _SchedulerView:
    """The trainer's handle on the schedule the engine steps (DeepSpeed's, or trainwell's given to the engine)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def step(self, *args: Any, **kwargs: Any) -> None:
        """No-op: ``engine.step()`` steps the schedule after every applied optimizer step."""

    def get_last_lr(self) -> list[float]:
        """Current learning rates."""
        inner = self._engine.lr_scheduler
        if inner is not None and hasattr(inner, "get_last_lr"):
            return list(inner.get_last_lr())
        return [group["lr"] for group in self._engine.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Empty: the schedule state lives in DeepSpeed's checkpoint."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """No-op: restored by ``engine.load_checkpoint``."""


def _engine_dtype(config: Mapping[str, Any]) -> torch.dtype:
    """The dtype the engine runs the model in, from its resolved config (bf16, fp16/amp, else float32)."""
    def enabled(section: str) -> bool:
        return bool((config.get(section) or {}).get("enabled") is True)

    if enabled("bf16"):
        return torch.bfloat16
    return torch.float16 if enabled("fp16") or enabled("amp") else torch.float32


class DeepSpeedBackend:
    """Trains through a ``deepspeed`` engine built from ``args.deepspeed`` with its ``"auto"`` values resolved."""

    def __init__(self, args: Any, device: torch.device, precision: Any = None) -> None:
        self.args = args
        self.device = device
        self.precision = precision
        self.ds_config = DeepSpeedConfig(args.deepspeed)  # the live config: is_deepspeed_zero3_enabled() sees it
        self.caps = Capabilities(handles_grad_accumulation=True, owns_precision=True,
                                 sharded_state=self.ds_config.is_zero3(), fixed_micro_batch_size=True,
                                 places_model=True, compiles_in_engine=True)
        self.deepspeed = import_deepspeed(device)
        ensure_process_group(device, getattr(args, "ddp_backend", None))
        self.engine: Any = None
        self.model: nn.Module | None = None
        self.wrapped: nn.Module | None = None
        self.optimizer: Any = None
        self.lr_scheduler: Any = None
        self.num_training_steps: int | None = None  # set by the trainer before setup_optimization
        self.resolved_config: dict[str, Any] | None = None
        # the dtype floating-point inputs are cast to (as upstream's _prepare_input); known once the engine is built
        self.input_dtype: torch.dtype | None = None
        self.scaler: Any = None  # the engine scales fp16 losses itself (its optimizer's loss scaler)
        self._boundary = True

    # -- model ---------------------------------------------------------------------------------------------------
    def model_init_context(self) -> AbstractContextManager[Any]:
        """Under ZeRO-3, ``deepspeed.zero.Init``: each rank materialises only its shard of every parameter."""
        if not self.ds_config.is_zero3():
            return _NULL
        config = self._resolve(None, num_training_steps=None)
        return self.deepspeed.zero.Init(config_dict_or_path=config)

    def prepare_model(self, model: nn.Module, *, training: bool) -> nn.Module:
        """Training: keep the model (the engine is built with the optimizer); inference: a ZeRO inference engine."""
        if self.engine is not None and self.model is model:
            return prepared(self.wrapped, "model")
        self.model = model.to(self.device)
        if training:
            self.wrapped = self.model
            return self.model
        config = self._resolve(model, num_training_steps=None)
        for key in ("optimizer", "scheduler"):
            config.pop(key, None)  # ZeRO inference: neither is built (the guide: "they will just be ignored")
        self.engine, *_ = self.deepspeed.initialize(model=model, config=config)
        self.input_dtype = _engine_dtype(config)
        self.engine.eval()
        self.wrapped = self.engine
        return self.engine

    def _resolve(self, model: nn.Module | None, num_training_steps: int | None) -> dict[str, Any]:
        resolved = DeepSpeedConfig.__new__(DeepSpeedConfig)
        resolved.config, resolved.mismatches = _copy(self.ds_config.config), []
        self.resolved_config = resolved.resolve(self.args, model=model, num_training_steps=num_training_steps)
        return self.resolved_config

    def setup_optimization(self, optimizer: torch.optim.Optimizer, lr_scheduler: Any) -> None:
        """Resolve the config and build the engine with DeepSpeed's or the trainer's optimizer and schedule."""
        steps = self.num_training_steps
        config = self._resolve(self.model, num_training_steps=steps)
        client_optimizer, client_scheduler = _choose_optimization(config, self.args, optimizer, lr_scheduler, steps)
        _check_offload_optimizer(config, uses_client_optimizer=client_optimizer is not None)
        engine, ds_optimizer, _, ds_scheduler = self.deepspeed.initialize(
            model=self.model, optimizer=client_optimizer, lr_scheduler=client_scheduler, config=config,
            model_parameters=None if client_optimizer is not None else
            [p for p in prepared(self.model, "model").parameters() if p.requires_grad])
        self.engine, self.wrapped = engine, engine
        self.input_dtype = _engine_dtype(config)
        self.optimizer, self.lr_scheduler = _OptimizerView(engine), _SchedulerView(engine)
        logger.info("DeepSpeed engine ready: ZeRO stage %d, optimizer %s, scheduler %s", self.ds_config.zero_stage,
                    type(ds_optimizer).__name__, type(ds_scheduler).__name__)

    # -- the step ------------------------------------------------------------------------------------------------
    def autocast(self) -> AbstractContextManager[Any]:
        """No autocast: DeepSpeed runs the model in the configured dtype itself."""
        return _NULL

    def no_sync(self, sync: bool) -> AbstractContextManager[Any]:
        """Tell the engine whether this micro-batch ends the accumulation group (it synchronises then)."""
        return self._micro_step(sync)

    @contextmanager
    def _micro_step(self, boundary: bool) -> Iterator[None]:
        self._boundary = boundary
        self.engine.set_gradient_accumulation_boundary(boundary)
        yield

    def backward(self, loss: torch.Tensor) -> None:
        """``engine.backward`` (unscaled: the trainer divided the loss already); inside a group also ``step()``."""
        self.engine.backward(loss, scale_wrt_gas=False)
        if not self._boundary:
            self.engine.step()  # bookkeeping only: no update before the boundary

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor | None:
        """DeepSpeed clips (``gradient_clipping``) inside its step; returns the last global gradient norm."""
        return self.last_grad_norm()

    def last_grad_norm(self) -> torch.Tensor | None:
        """The global gradient norm DeepSpeed measured in its last step (before clipping)."""
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(float(norm))

    def optimizer_step(self) -> bool:
        """``engine.step()`` at the accumulation boundary; False when an fp16 overflow skipped the update."""
        self.engine.step()
        applied = bool(self.engine.was_step_applied())
        if not applied:
            scale = getattr(self.engine.optimizer, "cur_scale", None)
            logger.warning("DeepSpeed skipped an optimizer step (fp16 gradient overflow); loss scale now %s. Many "
                           "skips in a row: raise fp16.initial_scale_power or use bf16/fp32.", scale)
        return applied

    def zero_grad(self) -> None:
        """No-op: the engine clears the gradients after each update."""

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dicts(self) -> Mapping[str, Any]:
        """Nothing extra: DeepSpeed's checkpoint holds optimizer, scheduler and loss-scaler state."""
        return {}

    def gathered_parameters(self) -> AbstractContextManager[Any]:
        """A context in which every ZeRO-3 parameter is whole on every rank (changes made on rank 0 are kept)."""
        if not self.ds_config.is_zero3() or self.model is None:
            return _NULL
        return self.deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=0)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's weights on the CPU; under ZeRO-3 a collective (every rank must call it)."""
        model = prepared(self.model, "model")
        if not self.ds_config.is_zero3():
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        with self.deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}

    def stream_state_dict(self, *, model_save: bool) -> Any:
        """Under ZeRO-3, the weights gathered one parameter at a time (``GatheredParameters`` of that parameter
        only), kept on the saving rank only; None below ZeRO-3 (every rank holds them whole).

        ``model_save`` with ``stage3_gather_16bit_weights_on_model_save`` not true raises
        :class:`~trainwell.backends.base.WeightsNotGathered` (then only the engine checkpoint is saved, the
        weights come out with ``zero_to_fp32``). A checkpoint's weights are streamed either way: at one parameter
        at a time their memory is not the reason for the setting.
        """
        if not self.ds_config.is_zero3() or self.model is None:
            return None
        if model_save and not self._gathers_on_model_save():
            raise WeightsNotGathered(
                "stage3_gather_16bit_weights_on_model_save is false in the DeepSpeed config, so save_model writes the "
                "ZeRO-3 engine checkpoint (global_step*/, latest, zero_to_fp32.py) instead of consolidated weights; "
                "get the weights with `trainwell zero-to-fp32 <folder> model.safetensors` (or the zero_to_fp32.py "
                "script in the folder), or set stage3_gather_16bit_weights_on_model_save: true")

        keep = bool(self.args.should_save)
        gathered = self.deepspeed.zero.GatheredParameters

        def gather(obj: Any) -> torch.Tensor | None:
            if not hasattr(obj, "ds_id"):  # a buffer, or a parameter ZeRO-3 left whole
                return obj.detach().to("cpu", copy=True) if keep else None
            with gathered([obj], modifier_rank=None):
                return obj.detach().to("cpu", copy=True) if keep else None

        def shape_of(obj: Any) -> tuple[int, ...]:
            return tuple(getattr(obj, "ds_shape", obj.shape))

        return tensor_stream(iter(self.model.state_dict(keep_vars=True).items()), gather, shape_of)

    def _gathers_on_model_save(self) -> bool:
        """``stage3_gather_16bit_weights_on_model_save`` (or its old name ``..._fp16_...``) is true."""
        return any(self.ds_config.is_true(f"zero_optimization.{key}") for key in (
            "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"))

    def async_engine_snapshot(self) -> Callable[[Path, Any], None] | None:
        """Never called: ``caps.async_checkpoint`` is False (the engine writes its checkpoint itself, with
        collectives on the training group); None, as for a backend with nothing to snapshot."""
        return None

    def save(self, folder: Path) -> None:
        """``engine.save_checkpoint``: ``global_step<N>/``, ``latest`` and ``zero_to_fp32.py`` in ``folder``."""
        if self.engine is None or self.engine.optimizer is None or getattr(self.args, "save_only_model", False):
            return
        self.engine.save_checkpoint(str(folder))

    def check_checkpoint(self, folder: Path) -> None:
        """Before any rank loads: raise CheckpointError when this rank's DeepSpeed files are missing from ``folder``.

        Run in the ranks' validation (so that all fall back together) rather than inside ``engine.load_checkpoint``,
        where one rank's missing shard would leave the others waiting in the engine's collectives.
        """
        if self.engine is None or self.engine.optimizer is None:
            return

        check_deepspeed_files(Path(folder), rank=get_rank(), zero_stage=self.ds_config.zero_stage,
                              world_size=get_world_size())

    def load(self, folder: Path) -> None:
        """``engine.load_checkpoint``: weights, optimizer, scheduler and loss scale (when ``folder`` has them)."""
        if self.engine is None:
            return
        if not (Path(folder) / "latest").is_file():
            if not _saved_model_only(Path(folder)):
                raise CheckpointError(f"{folder} has no DeepSpeed checkpoint ('latest' is missing) although it was not "
                                      "saved with save_only_model=True: its optimizer and scheduler state are lost; "
                                      "resume from another checkpoint")
            logger.warning("%s has no DeepSpeed checkpoint (saved with save_only_model=True): only the model weights "
                           "are restored, the optimizer and scheduler start fresh", folder)
            return

        saved_world = len(deepspeed_shards(Path(folder)))
        if self.ds_config.zero_stage >= 1 and saved_world and _resized(Path(folder), get_world_size()):
            load_resized(self.engine, Path(folder), saved_world=saved_world, scratch=Path(self.args.output_dir))
            return
        path, _ = self.engine.load_checkpoint(str(folder), load_optimizer_states=True, load_lr_scheduler_states=True)
        if path is None:
            raise RuntimeError(f"DeepSpeed could not load the checkpoint in {folder}; check that it was written with "
                               "the same ZeRO stage and number of processes")


def check_deepspeed_files(folder: Path, *, rank: int, zero_stage: int, world_size: int | None = None) -> None:
    """Raise CheckpointError unless ``folder`` holds ``latest``, its tag folder, model states and (ZeRO >= 1) this
    rank's ZeRO optimizer shard, or, written by another number of ranks than ``world_size`` (an elastic resume
    converts it), every one of its ranks' shards. A checkpoint saved with ``save_only_model=True`` (no ``latest``)
    passes."""
    latest = folder / "latest"
    if not latest.is_file():
        return  # load() decides: model-only checkpoint, or an error
    tag = latest.read_text(encoding="utf-8").strip()
    step = folder / tag
    missing = None
    if not tag or not step.is_dir():
        missing = f"the folder {step} named by 'latest'"
    elif not any(step.glob("*model_states.pt")):
        missing = f"the model states (*model_states.pt) in {step}"
    elif zero_stage >= 1 and world_size is not None and _resized(folder, world_size):
        shards = deepspeed_shards(folder)
        ranks = [int(p.name.split("zero_pp_rank_", 1)[1].split("_", 1)[0]) for p in shards]
        if ranks != list(range(len(ranks))):
            missing = f"a ZeRO optimizer shard (found ranks {ranks}) in {step}"
    elif zero_stage >= 1 and not any(step.glob(f"*zero_pp_rank_{rank}_*optim_states.pt")):
        missing = f"rank {rank}'s ZeRO optimizer shard (*zero_pp_rank_{rank}_*optim_states.pt) in {step}"
    if missing is not None:
        raise CheckpointError(f"{folder}: DeepSpeed checkpoint incomplete: {missing} is missing (the save was "
                              "interrupted, or the checkpoint was written by another number of processes)")


def _resized(folder: Path, world_size: int) -> bool:
    """Whether the DeepSpeed checkpoint in ``folder`` was written by another number of ranks than ``world_size``
    (told by trainwell's RNG files, one per rank, since a missing shard must not pass for a smaller job)."""
    saved = saved_rng_files(folder)
    return bool(saved) and max(saved) + 1 != world_size


def _saved_model_only(folder: Path) -> bool:
    """Whether the checkpoint's own ``training_args.json`` says ``save_only_model=True``."""
    try:
        saved = json.loads((folder / "training_args.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(isinstance(saved, dict) and saved.get("save_only_model"))


def _copy(config: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(config)


def _choose_optimization(config: dict[str, Any], args: Any, optimizer: Any, lr_scheduler: Any,
                         num_training_steps: int | None) -> tuple[Any, Any]:
    """The optimizer and scheduler to hand to ``deepspeed.initialize`` (None: DeepSpeed builds it from the config).

    The combinations of the DeepSpeed guide: a config ``optimizer`` replaces the trainer's; a config ``scheduler``
    replaces the trainer's; with a config optimizer and no config scheduler, trainwell's ``lr_scheduler_type``
    schedule is built on DeepSpeed's optimizer.
    """
    has_opt, has_sched = "optimizer" in config, "scheduler" in config
    ds_type = config.get("scheduler", {}).get("type")
    trainer_type = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if has_sched and ds_type in DS_TO_TRAINER_SCHEDULER and DS_TO_TRAINER_SCHEDULER[ds_type] != trainer_type:
        logger.info("DeepSpeed scheduler %s is used (the counterpart of lr_scheduler_type=%r); lr_scheduler_type=%r "
                    "is ignored", ds_type, DS_TO_TRAINER_SCHEDULER[ds_type], trainer_type)
    client_optimizer = None if has_opt else optimizer
    if not has_opt:
        config.setdefault("zero_allow_untested_optimizer", True)  # the trainer's torch optimizer
    if has_sched:
        return client_optimizer, None
    if not has_opt:
        return client_optimizer, lr_scheduler
    return None, _trainer_schedule_factory(args, num_training_steps)


def _trainer_schedule_factory(args: Any, num_training_steps: int | None) -> Any:
    """A callable DeepSpeed calls with its optimizer to build trainwell's ``lr_scheduler_type`` schedule."""
    if num_training_steps is None:
        raise ValueError("A DeepSpeed config optimizer with the trainer's scheduler needs the number of training "
                         "steps; train through Trainer.train(), or add a 'scheduler' section to the DeepSpeed config")

    def build(ds_optimizer: Any) -> Any:
        return get_scheduler(args.lr_scheduler_type, optimizer=ds_optimizer,
                             num_warmup_steps=args.get_warmup_steps(num_training_steps),
                             num_training_steps=num_training_steps,
                             scheduler_specific_kwargs=dict(args.lr_scheduler_kwargs or {}))

    return build


def _check_offload_optimizer(config: dict[str, Any], *, uses_client_optimizer: bool) -> None:
    """Offload with the trainer's (torch) optimizer needs ``zero_force_ds_cpu_optimizer: false``; fail early if not."""
    device = config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    if not uses_client_optimizer or device not in ("cpu", "nvme"):
        return
    force = config.get("zero_force_ds_cpu_optimizer")
    if force is None:
        logger.warning("offload_optimizer with the trainer's optimizer (no 'optimizer' section in the DeepSpeed "
                       "config): setting zero_force_ds_cpu_optimizer=false. DeepSpeed's CPU Adam (an 'optimizer' "
                       "section of type AdamW) is usually faster with offload.")
        config["zero_force_ds_cpu_optimizer"] = False
    elif force is True or str(force).lower() == "true":
        raise ValueError("The DeepSpeed config has offload_optimizer and zero_force_ds_cpu_optimizer=true, but no "
                         "'optimizer' section, so the trainer's torch optimizer would be used: add an 'optimizer' "
                         "section (e.g. AdamW) or set zero_force_ds_cpu_optimizer to false")
