"""The contract between the loop functions and the Trainer: the members of the Trainer the loops use, as types.

The loops (the :class:`~trainwell.loops.run.TrainingRun` and :func:`~trainwell.loops.train_loop.run_training`,
:func:`~trainwell.loops.eval_loop.run_evaluation`, ``auto_find_batch_size``'s retry) take a ``trainer``; these
Protocols name exactly
what they read, write and call on it, so the contract is written down once instead of existing only in the code that
uses it. :class:`trainwell.Trainer` satisfies them structurally (``tests/loops/test_contract.py`` checks every member
on a constructed Trainer). A member a loop starts to use is added here; a member the Trainer renames fails that test.

The Protocols hold only upstream's names: its public attributes and overridable methods, called through the trainer
so that a subclass's override is honoured, and the private members upstream's own loops use (``_past``,
``_memory_tracker``, ``_prepare_inputs``...). What trainwell's Trainer keeps for itself (its checkpoint part, the
per-run helpers of the step) is handed to the run by ``Trainer.train()`` as :class:`RunParts`, never read by the
loops from the Trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader

    from ..args.fields import TrainingArguments
    from ..backends.base import Backend
    from ..callbacks.events import CallbackHandler
    from ..utils.trainer_state import TrainerControl, TrainerState
    from ..runtime.memory import TrainerMemoryTracker
    from ..utils.outputs import EvalLoopOutput
    from ..data.stream_state import StreamPosition
    from .look_ahead import BatchLookAhead
    from .loop_state import Resumed, TrainPlan

__all__ = ["EvalLoopTrainer", "LoopTrainer", "RunCheckpoints", "RunParts", "RunTrainer", "TrainLoopTrainer"]


@runtime_checkable
class _TrainerCore(Protocol):
    """What every loop reads: the arguments, the state and control, the callbacks, the model and the backend."""

    args: TrainingArguments
    state: TrainerState
    control: TrainerControl
    callback_handler: CallbackHandler
    model: nn.Module
    backend: Backend
    optimizer: torch.optim.Optimizer | None
    _past: Any  # the memory of ``past_index`` models, reset by the loops and fed back as ``mems``


class RunCheckpoints(Protocol):
    """What a training run asks the Trainer's checkpoint part: the resume, after each optimizer step whether to stop
    (a SIGTERM/SIGINT: a checkpoint is saved first), and at the end the background save committed."""

    preempted: bool

    def load(self, folder: Path, plan: TrainPlan, look_ahead: BatchLookAhead,
             data_stream: StreamPosition | None = None) -> Resumed:
        """Restore everything saved in ``folder`` (``look_ahead``'s state and the stream's saved position too);
        returns the data position and the loaded TrainerState."""

    def stop_if_preempted(self, model: nn.Module, trial: Any, tr_loss: torch.Tensor) -> bool:
        """On a received SIGTERM/SIGINT: save a checkpoint, ask the loop to stop and return True."""

    def wait(self) -> None:
        """Wait for an ``async_save`` in flight to be committed."""


@dataclass(frozen=True)
class RunParts:
    """What ``Trainer.train()`` hands a run from the Trainer's own parts (none of them upstream API), so that the
    loops never read them from the Trainer.

    ``checkpoints``: the resume, the preemption check and the background save. ``flops_counter()``: the FLOPs rule
    of this run's model (or an override of ``floating_point_ops``). ``count_input_tokens(inputs, non_padding=)``:
    one micro-batch's tokens. ``scheduler_needs_metrics()``: whether the schedule steps on evaluation metrics
    rather than per step. ``compute_loss_takes_num_items()``: whether ``compute_loss`` (maybe an override of the
    older signature) takes ``num_items_in_batch``. ``adopt_input_dtype()``: called once the backend built its
    engine (the batch mover then knows the input dtype). ``register(run)``: the Trainer keeps the running run
    (its ``_save_checkpoint`` and the loop's attributes read it).
    """

    checkpoints: RunCheckpoints
    flops_counter: Callable[[], Callable[[Any], int]]
    count_input_tokens: Callable[..., int]
    scheduler_needs_metrics: Callable[[], bool]
    compute_loss_takes_num_items: Callable[[], bool]
    adopt_input_dtype: Callable[[], None]
    register: Callable[[Any], None]


@runtime_checkable
class TrainLoopTrainer(_TrainerCore, Protocol):
    """What :func:`~trainwell.loops.train_loop.run_training` and its :class:`~trainwell.loops.step.StepRunner` use."""

    lr_scheduler: Any

    def training_step(self, model: nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor: ...

    def floating_point_ops(self, inputs: dict[str, Any]) -> int: ...

    def _evaluate(self, trial: Any, ignore_keys_for_eval: list[str] | None,
                  skip_scheduler: bool = False) -> dict[str, float]: ...

    def _determine_best_metric(self, metrics: dict[str, float], trial: Any) -> bool: ...

    def _maybe_log_save_evaluate(self, tr_loss: torch.Tensor, grad_norm: torch.Tensor | float | None,
                                 model: nn.Module, trial: Any, epoch: float, ignore_keys_for_eval: list[str] | None,
                                 start_time: float | None = None, learning_rate: float | None = None) -> None: ...

    def _get_learning_rate(self) -> float: ...


@runtime_checkable
class RunTrainer(TrainLoopTrainer, Protocol):
    """What a :class:`~trainwell.loops.run.TrainingRun` and the run's functions use (its constructor builds the run
    from these; ``auto_find_batch_size``'s retry builds one per attempt)."""

    model_wrapped: nn.Module
    label_names: list[str]
    compute_loss_func: Callable[..., torch.Tensor] | None
    label_smoother: Any
    model_accepts_loss_kwargs: bool
    _train_batch_size: int
    _memory_tracker: TrainerMemoryTracker

    def get_train_dataloader(self) -> DataLoader: ...

    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None: ...

    def is_local_process_zero(self) -> bool: ...

    def is_world_process_zero(self) -> bool: ...

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None: ...

    def store_flos(self) -> None: ...

    def _load_best_model(self) -> None: ...

    def _rotate_checkpoints(self, use_mtime: bool = False, output_dir: str | None = None) -> None: ...

    def _finish_current_push(self) -> None: ...

    def _prepare_inputs(self, inputs: Any) -> Any: ...


@runtime_checkable
class EvalLoopTrainer(_TrainerCore, Protocol):
    """What :mod:`trainwell.loops.eval_loop` uses: the evaluation inputs and the overridable evaluation methods."""

    eval_dataset: Any
    compute_metrics: Callable[..., Mapping[str, Any]] | None
    preprocess_logits_for_metrics: Callable[[Any, Any], Any] | None
    label_names: list[str]
    can_return_loss: bool
    _memory_tracker: TrainerMemoryTracker

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None: ...

    def compute_loss(self, model: nn.Module, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: torch.Tensor | int | None = None) -> Any: ...

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval") -> dict[str, float]: ...

    def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader: ...

    def get_test_dataloader(self, test_dataset: Any) -> DataLoader: ...

    def evaluation_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput: ...

    def prediction_loop(self, dataloader: Any, description: str, prediction_loss_only: bool | None = None,
                        ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval") -> EvalLoopOutput: ...

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None) -> tuple[Any, Any, Any]: ...

    def _prepare_inputs(self, inputs: Any) -> Any: ...

    def _get_dataloader(self, dataset: Any, description: str, batch_size: int, sampler_fn: Any = None,
                        is_training: bool = False, dataloader_key: str | None = None) -> DataLoader: ...

    def _get_eval_sampler(self, dataset: Any) -> Any: ...


@runtime_checkable
class LoopTrainer(RunTrainer, EvalLoopTrainer, Protocol):
    """Everything the loops use: what :class:`trainwell.Trainer` provides to them."""


def protocol_members(protocol: type) -> set[str]:
    """The names a Protocol requires (its own and its bases'), for the test that keeps the contract honest."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass is object or klass is Protocol or not getattr(klass, "_is_protocol", False):
            continue
        names.update(getattr(klass, "__annotations__", {}))
        names.update(name for name, value in vars(klass).items()
                     if (callable(value) or isinstance(value, property)) and not name.startswith("__"))
    return names - {"_is_protocol", "_is_runtime_protocol"}
