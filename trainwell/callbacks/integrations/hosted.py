"""Integrations that only run inside their own service: AzureML, DagsHub, Flyte.

They cannot be exercised offline; each raises one clear error at construction when what it needs is missing (the
package, with the pip command, or the service's environment).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...utils.trackers import is_installed
from ..base import TrainerCallback
from ._common import check_installed, env_flag
from .mlflow import MLflowCallback

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["AzureMLCallback", "DagsHubCallback", "FlyteCallback"]

logger = logging.getLogger(__name__)


class AzureMLCallback(TrainerCallback):
    """Logs numeric values to the current AzureML run (``azureml.core.run.Run.get_context()``)."""

    def __init__(self, azureml_run: Any = None) -> None:
        check_installed("azure_ml")
        self.azureml_run = azureml_run

    def on_init_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Attach to the AzureML run this process belongs to."""
        if self.azureml_run is None and state.is_world_process_zero:
            from azureml.core.run import Run

            self.azureml_run = Run.get_context()

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        """Log each number under its key."""
        if self.azureml_run is not None and state.is_world_process_zero:
            for key, value in (logs or {}).items():
                if isinstance(value, (int, float)):
                    self.azureml_run.log(key, value, description=key)


class DagsHubCallback(MLflowCallback):
    """MLflow logging to a DagsHub repository (``MLFLOW_TRACKING_URI`` from ``dagshub.init()``).

    ``HF_DAGSHUB_LOG_ARTIFACTS`` (``true``: upload ``output_dir`` to the repository at train end),
    ``HF_DAGSHUB_MODEL_NAME`` (default ``main``), ``BRANCH`` (default ``main``).
    """

    def __init__(self) -> None:
        check_installed("dagshub")
        check_installed("mlflow")
        super().__init__()
        self.repo: Any = None

    def setup(self, args: Any, state: TrainerState, model: Any) -> None:
        """Connect the DagsHub repository named by ``MLFLOW_TRACKING_URI``, then set MLflow up."""
        from dagshub.upload import Repo

        remote = os.getenv("MLFLOW_TRACKING_URI")
        if not remote:
            raise RuntimeError("DagsHubCallback needs the MLFLOW_TRACKING_URI environment variable: run "
                               "`dagshub.init(...)` first, or remove 'dagshub' from report_to.")
        self.log_artifacts = env_flag("HF_DAGSHUB_LOG_ARTIFACTS")
        self.name = os.getenv("HF_DAGSHUB_MODEL_NAME") or "main"
        parts = remote.rstrip("/").split("/")
        self.repo = Repo(owner=parts[-2], name=parts[-1].split(".")[0], branch=os.getenv("BRANCH") or "main")
        self.path = Path("artifacts")
        super().setup(args, state, model)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Upload ``output_dir`` with ``HF_DAGSHUB_LOG_ARTIFACTS``, then end the MLflow run."""
        if getattr(self, "log_artifacts", False) and self.repo is not None and state.is_world_process_zero:
            self.repo.directory(str(self.path)).add_dir(args.output_dir)
        super().on_train_end(args, state, control, **kwargs)


class FlyteCallback(TrainerCallback):
    """Syncs checkpoints with the Flyte task's checkpoint and saves the log history as a Flyte Deck.

    Works only inside a Flyte task (``flytekit.current_context()``).
    """

    def __init__(self, save_log_history: bool = True, sync_checkpoints: bool = True) -> None:
        check_installed("flyte")
        if save_log_history and not (is_installed("flytekitplugins.deck") and is_installed("pandas")):
            logger.warning("Saving the log history as a Flyte Deck needs `pip install flytekitplugins-deck-standard "
                           "pandas`; it is off.")
            save_log_history = False
        from flytekit import current_context

        self.cp = current_context().checkpoint
        self.save_log_history = save_log_history
        self.sync_checkpoints = sync_checkpoints

    def on_save(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Hand the checkpoint folder just written to Flyte."""
        if self.sync_checkpoints and state.is_world_process_zero:
            self.cp.save(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """The log history as a table Deck."""
        if self.save_log_history and state.is_world_process_zero:
            import pandas as pd
            from flytekit import Deck
            from flytekitplugins.deck.renderer import TableRenderer

            Deck("Log History", TableRenderer().to_html(pd.DataFrame(state.log_history)))
