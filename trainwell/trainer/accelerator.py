"""``Trainer.accelerator``: the part of ``accelerate.Accelerator`` that user code calls on the upstream Trainer.

Upstream's Trainer runs on Hugging Face Accelerate and exposes its ``Accelerator``; callbacks, overrides and
scripts call ``trainer.accelerator.gather(...)``, ``.is_main_process``, ``.unwrap_model(...)``,
``.wait_for_everyone()``, ``.backward(loss)``... trainwell does not use accelerate: :class:`TrainerAccelerator` answers
the same calls from trainwell's own process-group helpers and the Trainer's backend, so no ``accelerate`` import is
involved. What it does not offer raises ``AttributeError`` naming the trainwell way.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterator
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

from ..args.runtime import DEEPSPEED, FSDP, MULTI_CPU, MULTI_GPU, NO  # noqa: F401  (accelerate's names, from here too)
from ..args.runtime import DistributedState
from ..runtime.distributed import all_gather_object, is_dist
from ..loops.gather import gather_across_ranks, is_placeholder_batch
from ..loops.nested import nested_map
from ..loops.train_hooks import forward_precision, upcasts_outputs
from ..utils.model_utils import unwrap_model
from ..data.sharding import seed_random_sampler_by_epoch, shard_dataloader


class TrainerAccelerator(DistributedState):
    """What a Trainer's ``accelerator`` attribute offers, backed by the Trainer's arguments and backend; where this
    process stands (``device``, ``num_processes``, ``process_index``, ``is_main_process``, ``distributed_type``...)
    comes from :class:`~trainwell.args.runtime.DistributedState` over the Trainer's current ``args``."""

    #: accelerate's ``Accelerator.even_batches``: whether :meth:`prepare` completes the last round of batches from the
    #: start of the data so every process runs as many (sentence-transformers sets it False for training loaders)
    even_batches: bool = True

    def __init__(self, trainer: Any) -> None:
        self._trainer = trainer

    @property
    def _args(self) -> Any:  # the Trainer's arguments of the moment (a hyper-parameter trial replaces them)
        return self._trainer.args

    # -- where this process stands ------------------------------------------------------------------------------
    @property
    def state(self) -> TrainerAccelerator:
        """``accelerator.state`` (``.device``, ``.num_processes``, ``.process_index``... are on this object)."""
        return self

    @property
    def is_last_process(self) -> bool:
        """True on the last process of the job."""
        return self.process_index == self.num_processes - 1

    @property
    def parallelism_config(self) -> None:
        """accelerate's ``ParallelismConfig`` (context/tensor/sequence parallelism): always None, since trainwell
        shards with DDP, FSDP or DeepSpeed only (TRL reads it to decide whether sequence parallelism is on)."""
        return None

    @property
    def mixed_precision(self) -> str:
        """``"fp16"``, ``"bf16"`` or ``"no"``."""
        args = self._trainer.args
        return "fp16" if args.fp16 else ("bf16" if args.bf16 else "no")

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step."""
        return self._trainer.args.gradient_accumulation_steps

    @property
    def scaler(self) -> Any:
        """The fp16 gradient scaler, or None."""
        scaler = self._trainer.backend.scaler
        return scaler if scaler is not None and scaler.is_enabled() else None

    @property
    def deepspeed_plugin(self) -> Any:
        """None without DeepSpeed; else an object with ``deepspeed_config`` (the config dict) and ``zero_stage``."""
        config = self._trainer.backend.ds_config
        if self._trainer.args.deepspeed is None or config is None:
            return None

        return SimpleNamespace(deepspeed_config=config.config, zero_stage=config.zero_stage, hf_ds_config=config)

    # -- synchronisation ----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the body on the main process first, then on the others."""
        with self._trainer.args.main_process_first(local=False):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the body on each node's main process first, then on the others."""
        with self._trainer.args.main_process_first(local=True):
            yield

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process of each node only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    # -- collectives --------------------------------------------------------------------------------------------
    def gather(self, tensor: Any) -> Any:
        """Every process's tensors (nested structures too) concatenated along dim 0 in rank order.

        Shapes may differ across processes: smaller tensors are padded with -100 first (accelerate requires equal
        shapes, or ``pad_across_processes`` beforehand).
        """
        return gather_across_ranks(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather`` for evaluation results; non-tensor data (or ``use_gather_object``) is gathered as objects.

        trainwell's evaluation sampler gives each sample to exactly one process (no padding duplicates), so there
        is nothing to drop from the end, unlike accelerate; while a process predicts a placeholder batch (it had no
        sample left), it gives nothing here or to :meth:`gather`.
        """
        if not is_dist():
            return input_data
        found: list[bool] = []

        def note(value: Any) -> Any:
            found.append(isinstance(value, torch.Tensor))
            return value

        nested_map(note, input_data)
        if use_gather_object or not any(found):
            parts = [part for placeholder, part in all_gather_object((is_placeholder_batch(), input_data))
                     if not placeholder]
            return [item for part in parts for item in part] if all(isinstance(p, list) for p in parts) else parts
        return self.gather(input_data)

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum", scale: float = 1.0) -> torch.Tensor:
        """Sum (``"sum"``) or average (``"mean"``) ``tensor`` over all processes, times ``scale``."""
        if reduction not in ("sum", "mean", "none"):
            raise ValueError(f"accelerator.reduce(reduction={reduction!r}): use 'sum', 'mean' or 'none'")
        out = tensor.detach().clone() * scale
        if reduction == "none" or not is_dist():
            return out

        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out / dist.get_world_size() if reduction == "mean" else out

    def pad_across_processes(self, tensor: torch.Tensor, dim: int = 0, pad_index: int = 0,
                             pad_first: bool = False) -> torch.Tensor:
        """Pad ``tensor`` along ``dim`` to the largest size any process holds (so that ``gather`` can stack it)."""
        if not is_dist() or tensor.dim() == 0:
            return tensor

        size = torch.tensor([tensor.shape[dim]], device=tensor.device)
        sizes = [torch.empty_like(size) for _ in range(dist.get_world_size())]
        dist.all_gather(sizes, size)
        longest = int(max(s.item() for s in sizes))
        if longest == tensor.shape[dim]:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = longest
        padded = tensor.new_full(shape, pad_index)
        index = [slice(None)] * tensor.dim()
        index[dim] = slice(longest - tensor.shape[dim], longest) if pad_first else slice(0, tensor.shape[dim])
        padded[tuple(index)] = tensor
        return padded

    # -- the model and the step ---------------------------------------------------------------------------------
    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> nn.Module:
        """The user's module inside DDP / DeepSpeed wrappers; a ``torch.compile`` wrapper is kept unless
        ``keep_torch_compile=False`` (as accelerate)."""
        inner = getattr(model, "_orig_mod", None)
        if inner is not None:
            if keep_torch_compile:
                model._orig_mod = unwrap_model(inner)
                return model
            return unwrap_model(inner)
        return unwrap_model(model)

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward through the Trainer's backend (grad scaler, DeepSpeed engine); the loss is not rescaled."""
        self._trainer.backend.backward(loss)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2) -> torch.Tensor | None:
        """Clip the model's gradients through the backend (unscaling fp16 first); ``parameters`` must be the
        model's (the backend clips all of them, as the Trainer does)."""
        return self._trainer.backend.clip_grad_norm(max_norm)

    def autocast(self, autocast_handler: Any = None) -> Any:
        """The Trainer's mixed-precision context."""
        return self._trainer.backend.autocast()

    def prepare(self, *objects: Any, device_placement: Any = None) -> Any:
        """Modules go to this process's device; optimizers and schedulers come back unchanged; a data loader is
        split across the processes and its random sampler made epoch-seeded, as accelerate prepares it for upstream.

        trainwell wraps the model (DDP/FSDP/DeepSpeed) and shards its own data loaders when training starts, so
        there is nothing else to prepare. A data loader built elsewhere (sentence-transformers' training and
        evaluation loaders, a script's) gets what accelerate's ``prepare_data_loader`` gives it: on several processes
        its batch sampler behind accelerate's ``BatchSamplerShard`` (whole batches in turn, the last round completed
        from the start unless :attr:`even_batches` is False; :func:`trainwell.data.sharding.shard_dataloader`), and its
        ``RandomSampler`` (the sampler, or its batch sampler's) replaced by
        :class:`~trainwell.data.samplers.EpochSeededRandomSampler`: epoch ``e`` draws the order of seed ``seed + e``,
        which is what a library's loader (sentence-transformers') draws under upstream from its second epoch on.
        """
        out = tuple(obj.to(self.device) if isinstance(obj, nn.Module)
                    else self._prepare_dataloader(obj) if isinstance(obj, torch.utils.data.DataLoader) else obj
                    for obj in objects)
        return out[0] if len(out) == 1 else out

    def _prepare_dataloader(self, loader: torch.utils.data.DataLoader) -> torch.utils.data.DataLoader:
        loader = seed_random_sampler_by_epoch(loader)
        return shard_dataloader(loader, num_processes=self.num_processes, process_index=self.process_index,
                                even_batches=self.even_batches)

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> nn.Module:
        """``model`` on this process's device (unless ``device_placement=False``). A model trained by the Trainer
        is wrapped by its backend when training starts; ``evaluation_mode=True`` (a frozen reference model, as
        TRL's DPO passes) needs no wrapper, so it is only placed.

        Under fp16/bf16 (DeepSpeed aside) its forward runs in the Trainer's autocast with float32 outputs from
        now on, wherever it is called, as accelerate's ``prepare_model`` replaces the forward: a reference model
        that a library runs outside the Trainer's own steps (TRL's OnlineDPO) computes as it does upstream."""
        if upcasts_outputs(self._trainer.args):
            forward_precision(unwrap_model(model), lambda: self._trainer.backend.autocast())
        if device_placement is False:
            return model
        return model.to(self.device)

    def get_state_dict(self, model: nn.Module | None = None, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The full (consolidated) weights of the Trainer's model."""
        backend = self._trainer.backend
        state = backend.full_state_dict()
        if state is None:  # nothing sharded: the model's own state dict is whole
            model = model if model is not None else backend.model or self._trainer.model
            state = (unwrap_model(model) if unwrap else model).state_dict()
        return state

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save`` on the main process only."""
        if self.is_main_process:
            torch.save(obj, f)

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop references, run the garbage collector and empty the CUDA cache."""
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None for _ in objects]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"trainer.accelerator.{name} is not provided: trainwell does not run on accelerate; "
                             "use the Trainer's own methods and arguments (see trainwell.trainer.accelerator for what the "
                             "accelerator offers)")

