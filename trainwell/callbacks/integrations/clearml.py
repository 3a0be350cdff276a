"""``ClearMLCallback``: ClearML tasks (``pip install trainwell[clearml]``; ``CLEARML_OFFLINE_MODE=1`` works offline).

Environment variables (upstream's): ``CLEARML_PROJECT`` (default ``"HuggingFace Transformers"``), ``CLEARML_TASK``
(default ``"Trainer"``), ``CLEARML_LOG_MODEL`` (``true``: upload each checkpoint as an output model; default true
for a task this callback creates, false for one the user created), plus everything clearml reads itself.
"""

from __future__ import annotations

import logging
import os
from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

from ._common import check_installed, env_flag, require, scalar_logs
from ..base import TrainerCallback
from ._lazy import LazyTrackerCallback

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["ClearMLCallback"]

logger = logging.getLogger(__name__)

# Values reported once (a task's "single values") rather than as series: upstream's list.
_SINGLE_VALUES = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                  "total_flos", "epoch")


def _hparams(args: Any) -> dict[str, Any]:
    """The arguments as ClearML hyper-parameters (tokens left out)."""
    if is_dataclass(args):
        items = {f.name: getattr(args, f.name) for f in fields(args) if f.init}
    else:
        items = dict(vars(args))
    return {k: v for k, v in items.items() if not k.endswith("_token")}


class ClearMLCallback(LazyTrackerCallback):
    """Logs the arguments (section ``Transformers``), the model config and the metrics to a ClearML task.

    Joins the task already running in this process (``Task.current_task()``) or creates one; a task it created is
    closed at train end. Only the world main process logs.
    """

    _hparams_section = "Transformers"
    _model_config_section = "Model Configuration"
    on_predict = TrainerCallback.on_predict  # predict()'s metrics are not logged (as upstream)

    def __init__(self) -> None:
        check_installed("clearml")
        self._clearml: Any = None
        self._initialized = False
        self._clearml_task: Any = None
        self._log_model = False
        self._close_on_train_end = False
        self._checkpoints_saved: list[Any] = []

    def setup(self, args: Any, state: TrainerState, model: Any, processing_class: Any = None, **kwargs: Any) -> None:
        """Join or create the task, then connect the arguments and the model config."""
        if self._initialized:
            return
        self._initialized = True
        if not state.is_world_process_zero:
            return
        self._clearml = clearml = require("clearml")
        if env_flag("CLEARML_OFFLINE_MODE") and not clearml.Task.is_offline():
            clearml.Task.set_offline(True)  # clearml reads the variable once, at import; honour it set later too
        current = clearml.Task.current_task()
        if current is not None:
            self._clearml_task = current
            self._log_model = env_flag("CLEARML_LOG_MODEL", "FALSE")
        else:
            self._clearml_task = clearml.Task.init(
                project_name=os.getenv("CLEARML_PROJECT", "HuggingFace Transformers"),
                task_name=os.getenv("CLEARML_TASK", "Trainer"),
                auto_connect_frameworks={"tensorboard": False, "pytorch": False},
                output_uri=True,
            )
            self._log_model = env_flag("CLEARML_LOG_MODEL", "TRUE")
            self._close_on_train_end = clearml.Task.running_locally()
        self._clearml_task.connect(_hparams(args), name=self._hparams_section)
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            self._clearml_task.set_configuration_object(name=self._model_config_section,
                                                        config_dict=config.to_dict())

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                       processing_class: Any = None, **kwargs: Any) -> None:
        """Set the task up (again for each hyper-parameter search trial)."""
        self._checkpoints_saved = []
        if state.is_hyper_param_search:
            self._initialized = False
        if not self._initialized:
            self.setup(args, state, model, processing_class)

    def _logging(self, state: TrainerState) -> bool:
        return self._clearml_task is not None and state.is_world_process_zero

    def _log(self, args: Any, state: TrainerState, logs: dict[str, Any]) -> None:
        """Series under ``train``/``eval``/``test`` titles; end-of-run totals as single values."""
        task_logger = self._clearml_task.get_logger()
        numbers, dropped = scalar_logs(logs)
        for key, value in numbers.items():
            if key in _SINGLE_VALUES:
                task_logger.report_single_value(name=key, value=value)
                continue
            title, series = "train", key
            for prefix in ("eval", "test"):
                if key.startswith(prefix + "_"):
                    title, series = prefix, key[len(prefix) + 1:]
            task_logger.report_scalar(title=title, series=series, value=value, iteration=state.global_step)
        for key in dropped:
            logger.warning("Not logging %r to ClearML: it is not a number.", key)

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """With ``CLEARML_LOG_MODEL``, upload the checkpoint as an output model (keeping ``save_total_limit``)."""
        if not (self._log_model and self._logging(state)):
            return
        name = f"checkpoint-{state.global_step}"
        output_model = self._clearml.OutputModel(task=self._clearml_task, name=name)
        output_model.connect(task=self._clearml_task, name=name)
        output_model.update_weights_package(weights_path=os.path.join(args.output_dir, name), target_filename=name,
                                            iteration=state.global_step, auto_delete_file=False)
        self._checkpoints_saved.append(output_model)
        while args.save_total_limit and args.save_total_limit < len(self._checkpoints_saved):
            try:
                self._clearml.model.Model.remove(self._checkpoints_saved[0], delete_weights_file=True, force=True,
                                                 raise_on_errors=True)
            except Exception as err:  # the server may refuse; keep training
                logger.warning("Could not remove ClearML model %s beyond save_total_limit: %s",
                               self._checkpoints_saved[0].name, err)
                break
            self._checkpoints_saved = self._checkpoints_saved[1:]

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the task this callback created."""
        if self._close_on_train_end and self._clearml_task is not None:
            self._clearml_task.close()
            self._clearml_task = None  # later logs (an evaluate() after train) have no task to go to, as upstream
