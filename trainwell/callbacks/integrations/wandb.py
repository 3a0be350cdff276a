"""``WandbCallback``: Weights & Biases runs (``pip install trainwell[wandb]``; ``WANDB_MODE=offline`` works offline).

Environment variables (upstream's): ``WANDB_PROJECT`` (default ``"huggingface"``), ``WANDB_LOG_MODEL``
(``"end"``: the final model as an artifact, ``"checkpoint"``: every checkpoint folder, ``"false"``),
``WANDB_WATCH`` (``"gradients"``, ``"parameters"``, ``"all"``, ``"false"``), ``WANDB_DISABLED`` (``true``: the
callback does nothing), and everything wandb itself reads (``WANDB_MODE``, ``WANDB_DIR``, ``WANDB_API_KEY``...).
"""

from __future__ import annotations

import logging
import numbers
import os
import tempfile
from enum import Enum
from typing import TYPE_CHECKING, Any

from ._common import SINGLE_VALUE_SCALARS, check_installed, env_flag, require, run_config
from ._lazy import LazyTrackerCallback
from .tensorboard import rewrite_logs
from ...checkpoint.weights import save_model_weights

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["WandbCallback", "WandbLogModel"]

logger = logging.getLogger(__name__)


class WandbLogModel(str, Enum):
    """Values of ``WANDB_LOG_MODEL``; an unknown value disables model logging with a warning (as upstream)."""

    CHECKPOINT = "checkpoint"
    END = "end"
    FALSE = "false"

    @property
    def is_enabled(self) -> bool:
        """Whether a model is uploaded at all."""
        return self in (WandbLogModel.CHECKPOINT, WandbLogModel.END)

    @classmethod
    def _missing_(cls, value: Any) -> WandbLogModel:
        if not isinstance(value, str):
            raise TypeError(f"WANDB_LOG_MODEL must be a string, got {type(value).__name__}.")
        if value.lower() in cls._value2member_map_:
            return cls(value.lower())
        logger.warning("Unknown WANDB_LOG_MODEL=%r (expected 'end', 'checkpoint' or 'false'): not logging the model.",
                       value)
        return cls.FALSE


def _num_parameters(model: Any) -> int | None:
    if hasattr(model, "num_parameters"):
        return int(model.num_parameters())
    parameters = getattr(model, "parameters", None)
    return sum(p.numel() for p in parameters()) if callable(parameters) else None


def _model_name(args: Any, run: Any) -> str:
    """Artifact name: ``model-<run name>`` when the run was named, else ``model-<run id>`` (upstream's rule)."""
    named = args.run_name is not None and args.run_name != args.output_dir
    return f"model-{run.name}" if named else f"model-{run.id}"


class WandbCallback(LazyTrackerCallback):
    """Logs the config, metrics (against ``train/global_step``), and optionally the model to W&B.

    Only the world main process talks to W&B. A run is started at train begin unless one is already active
    (``wandb.init`` called by the user); it is left open at train end, as upstream does, so that a following
    ``evaluate()`` logs into the same run (``wandb.finish()`` closes it).
    """

    def __init__(self) -> None:
        check_installed("wandb")
        self._wandb: Any = None
        self._initialized = False
        self._disabled = env_flag("WANDB_DISABLED")
        self._log_model = WandbLogModel(os.getenv("WANDB_LOG_MODEL", "false"))
        if self._disabled:
            logger.info("WANDB_DISABLED is set: WandbCallback will not log anything.")

    def setup(self, args: Any, state: TrainerState, model: Any, **kwargs: Any) -> None:
        """Start (or join) the run and record the config; called once, at train begin or the first log."""
        self._initialized = True
        if self._disabled or not state.is_world_process_zero:
            return
        self._wandb = wandb = require("wandb")
        init_args: dict[str, Any] = {}
        if state.trial_name is not None:
            init_args["name"] = state.trial_name
            init_args["group"] = args.run_name or args.output_dir
        elif args.run_name is not None:
            init_args["name"] = args.run_name
        if wandb.run is None:
            wandb.init(project=os.getenv("WANDB_PROJECT", "huggingface"), **init_args)
        wandb.config.update(run_config(args, model), allow_val_change=True)
        wandb.define_metric("train/global_step")
        wandb.define_metric("*", step_metric="train/global_step", step_sync=True)
        watch = os.getenv("WANDB_WATCH", "false")
        if watch in ("all", "parameters", "gradients") and model is not None:
            wandb.watch(model, log=watch, log_freq=max(100, state.logging_steps))
        count = _num_parameters(model)
        if count is not None:
            wandb.config.update({"model/num_parameters": count}, allow_val_change=True)

    def _logging(self, state: TrainerState) -> bool:
        return self._wandb is not None and state.is_world_process_zero and not self._disabled

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                       **kwargs: Any) -> None:
        """Start the run; during hyper-parameter search, one run per trial."""
        if state.is_hyper_param_search and self._initialized and self._logging(state):
            self._wandb.finish()
            self._initialized = False
        super().on_train_begin(args, state, control, model=model, **kwargs)

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """End-of-training totals go to the run summary, everything else to the history."""
        for key in SINGLE_VALUE_SCALARS:
            if key in logs:
                self._wandb.run.summary[key] = logs[key]
        series = rewrite_logs({k: v for k, v in logs.items() if k not in SINGLE_VALUE_SCALARS})
        self._wandb.log({**series, "train/global_step": state.global_step})

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """With ``WANDB_LOG_MODEL=checkpoint``, upload the checkpoint folder just written."""
        if self._log_model != WandbLogModel.CHECKPOINT or not self._logging(state):
            return
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if not os.path.isdir(folder):
            return
        artifact = self._wandb.Artifact(name=_model_name(args, self._wandb.run), type="model",
                                        metadata=self._numeric_summary())
        artifact.add_dir(folder)
        epoch = round(state.epoch or 0, 2)
        self._wandb.log_artifact(artifact, aliases=[f"epoch_{epoch}", f"checkpoint_global_step_{state.global_step}"])

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                     processing_class: Any = None, **kwargs: Any) -> None:
        """With ``WANDB_LOG_MODEL=end`` (or ``checkpoint``), upload the final model as an artifact."""
        if not self._log_model.is_enabled or not self._logging(state) or model is None:
            return

        metadata = self._numeric_summary()
        metadata["final_model"] = True
        artifact = self._wandb.Artifact(name=_model_name(args, self._wandb.run), type="model", metadata=metadata)
        with tempfile.TemporaryDirectory() as folder:
            save_model_weights(model, folder, safe_serialization=args.save_safetensors)
            if processing_class is not None and hasattr(processing_class, "save_pretrained"):
                processing_class.save_pretrained(folder)
            artifact.add_dir(folder)
            self._wandb.run.log_artifact(artifact, aliases=["final_model"])  # add_dir copied the files

    def _log_predict(self, state: TrainerState, metrics: dict[str, Any]) -> None:
        self._wandb.log(rewrite_logs(metrics))

    def _numeric_summary(self) -> dict[str, Any]:
        summary = {k: v for k, v in dict(self._wandb.summary).items()
                   if isinstance(v, numbers.Number) and not k.startswith("_")}
        summary["model/num_parameters"] = self._wandb.config.get("model/num_parameters")
        return summary
