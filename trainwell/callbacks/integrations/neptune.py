"""``NeptuneCallback``: Neptune runs (``pip install trainwell[neptune]``; ``NEPTUNE_MODE=offline`` works offline).

Neptune reads ``NEPTUNE_API_TOKEN``, ``NEPTUNE_PROJECT`` and ``NEPTUNE_MODE`` itself; upstream deprecates this
integration, trainwell keeps it with the same arguments.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import TYPE_CHECKING, Any

from ..base import TrainerCallback
from ._common import check_installed, require
from .tensorboard import rewrite_logs
from ... import __version__

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["NeptuneCallback", "NeptuneMissingConfiguration"]


class NeptuneMissingConfiguration(Exception):
    """Neptune has no project or API token."""

    def __init__(self) -> None:
        super().__init__("NeptuneCallback needs a project and an API token: set NEPTUNE_PROJECT and "
                         "NEPTUNE_API_TOKEN (or pass project=/api_token=), or NEPTUNE_MODE=offline to log locally.")


class NeptuneCallback(TrainerCallback):
    """Logs the arguments, the model config and the metrics under ``base_namespace`` of a Neptune run.

    Args (upstream's): ``api_token``, ``project``, ``name``, ``base_namespace`` (default ``"finetuning"``), ``run``
    (an existing ``neptune.Run`` to log into), ``log_parameters``, ``log_checkpoints`` (``"same"``: every checkpoint,
    ``"last"``: only the newest, ``"best"``: the best one, ``None``: none), and keyword arguments for
    ``neptune.init_run``.
    """

    integration_version_key = "source_code/integrations/trainwell"
    model_parameters_key = "model_parameters"
    trial_name_key = "trial"
    trial_params_key = "trial_params"
    trainer_parameters_key = "trainer_parameters"
    flat_metrics = {"train/epoch"}

    def __init__(self, *, api_token: str | None = None, project: str | None = None, name: str | None = None,
                 base_namespace: str = "finetuning", run: Any = None, log_parameters: bool = True,
                 log_checkpoints: str | None = None, **neptune_run_kwargs: Any) -> None:
        check_installed("neptune")
        if log_checkpoints not in (None, "same", "last", "best"):
            raise ValueError(f"NeptuneCallback(log_checkpoints={log_checkpoints!r}): use 'same', 'last', 'best' or "
                             "None.")
        self._base_namespace_path = base_namespace
        self._log_parameters = log_parameters
        self._log_checkpoints = log_checkpoints
        self._initial_run = run
        self._run: Any = None
        self._init_run_kwargs = {"api_token": api_token, "project": project, "name": name, **neptune_run_kwargs}
        self._should_upload_checkpoint = log_checkpoints is not None
        self._recent_checkpoint_path: str | None = None
        self._volatile_checkpoints_dir: str | None = None
        self._target_checkpoints_namespace = (f"checkpoints/{log_checkpoints}" if log_checkpoints in ("last", "best")
                                              else "checkpoints")

    @property
    def run(self) -> Any:
        """The Neptune run (created on first use)."""
        if self._run is None:
            if self._initial_run is not None:
                self._run, self._initial_run = self._initial_run, None
            else:
                neptune = require("neptune")
                from neptune.exceptions import NeptuneMissingApiTokenException, NeptuneMissingProjectNameException

                try:
                    self._run = neptune.init_run(**self._init_run_kwargs)
                except (NeptuneMissingProjectNameException, NeptuneMissingApiTokenException) as err:
                    raise NeptuneMissingConfiguration() from err
        return self._run

    @property
    def _metadata_namespace(self) -> Any:
        return self.run[self._base_namespace_path]

    @classmethod
    def get_run(cls, trainer: Any) -> Any:
        """The run of the ``NeptuneCallback`` among ``trainer``'s callbacks."""
        for callback in trainer.callback_handler.callbacks:
            if isinstance(callback, cls):
                return callback.run
        raise Exception("The trainer doesn't have a NeptuneCallback configured.")

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Check ``log_checkpoints="best"`` against the arguments."""
        if self._log_checkpoints == "best" and not args.load_best_model_at_end:
            raise ValueError("NeptuneCallback(log_checkpoints='best') needs load_best_model_at_end=True.")
        if self._log_checkpoints and args.save_total_limit is not None:
            self._volatile_checkpoints_dir = tempfile.mkdtemp(prefix="trainwell-neptune-")

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, model: Any = None,
                       **kwargs: Any) -> None:
        """Log the parameters (and the trial during hyper-parameter search)."""
        if not state.is_world_process_zero:
            return
        if self._run is None and self._initial_run is None and self._init_run_kwargs.get("name") is None:
            self._init_run_kwargs["name"] = args.run_name  # trainwell: the run is named like the other trackers'

        self.run[self.integration_version_key] = __version__
        if self._log_parameters:
            self._metadata_namespace[self.trainer_parameters_key] = args.to_sanitized_dict()
            config = getattr(model, "config", None)
            if config is not None and hasattr(config, "to_dict"):
                from neptune.utils import stringify_unsupported

                self._metadata_namespace[self.model_parameters_key] = stringify_unsupported(config.to_dict())
        if state.is_hyper_param_search:
            self._metadata_namespace[self.trial_name_key] = state.trial_name
            if state.trial_params is not None:
                self._metadata_namespace[self.trial_params_key] = state.trial_params

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        """Numbers as series at ``state.global_step`` (``train/epoch`` as a single value)."""
        if not state.is_world_process_zero or not logs:
            return
        for name, value in rewrite_logs(logs).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if name in self.flat_metrics:
                    self._metadata_namespace[name] = value
                else:
                    self._metadata_namespace[name].log(value, step=state.global_step)

    def on_evaluate(self, args: Any, state: TrainerState, control: TrainerControl,
                    metrics: dict[str, Any] | None = None, **kwargs: Any) -> None:
        """With ``log_checkpoints="best"``, upload the next checkpoint only when this evaluation improved."""
        if self._log_checkpoints == "best" and metrics:
            name = args.metric_for_best_model
            name = name if name.startswith("eval_") else f"eval_{name}"
            value = metrics.get(name)
            better = (lambda a, b: a > b) if args.greater_is_better else (lambda a, b: a < b)
            self._should_upload_checkpoint = state.best_metric is None or (value is not None
                                                                           and better(value, state.best_metric))

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Upload the checkpoint folder just written (per ``log_checkpoints``)."""
        if not (self._should_upload_checkpoint and state.is_world_process_zero):
            return
        checkpoint = f"checkpoint-{state.global_step}"
        source = os.path.join(args.output_dir, checkpoint)
        target = source
        if self._volatile_checkpoints_dir is not None:  # rotation may delete the folder before the upload ends
            target = os.path.join(self._volatile_checkpoints_dir, checkpoint)
            shutil.copytree(source, target, dirs_exist_ok=True)
        namespace = self._metadata_namespace[self._target_checkpoints_namespace]
        namespace.upload_files(target)
        if self._log_checkpoints in ("last", "best") and self._recent_checkpoint_path is not None:
            namespace.delete_files(self._recent_checkpoint_path)
        self._recent_checkpoint_path = target

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Stop the run; remove the copies of checkpoints this callback made."""
        if self._run is not None:
            self._run.stop()
            self._run = None
        if self._volatile_checkpoints_dir is not None:
            shutil.rmtree(self._volatile_checkpoints_dir, ignore_errors=True)
            self._volatile_checkpoints_dir = None
