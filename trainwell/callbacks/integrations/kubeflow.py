"""``KubeflowCallback``: training progress reported to a Kubeflow Trainer TrainJob's status endpoint.

Inside a TrainJob with the ``TrainJobRuntimeStatus`` feature the controller sets ``KUBEFLOW_TRAINER_SERVER_URL`` (the
HTTPS endpoint), ``KUBEFLOW_TRAINER_SERVER_CA_CERT`` (a CA file) and ``KUBEFLOW_TRAINER_SERVER_TOKEN`` (a token file);
``TrainingArguments`` then adds ``"kubeflow"`` to ``report_to`` by itself, as upstream does (unless
``DISABLE_KUBEFLOW_INTEGRATION=true``). The world main process POSTs ``{"trainerStatus": {...}}`` with the progress in
percent, the estimated seconds left and the latest numeric logs: at the start, at most every 5 s during training, and
at the end (100%). A failed report is logged at debug level and never stops training.
"""

from __future__ import annotations

import json
import logging
import os
import time
import ssl
import urllib.request
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ...utils.trackers import is_kubeflow_available
from ..base import TrainerCallback

if TYPE_CHECKING:
    from ...utils.trainer_state import TrainerControl, TrainerState

__all__ = ["KubeflowCallback"]

logger = logging.getLogger(__name__)

SERVER_URL, CA_CERT, TOKEN_PATH = ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_CA_CERT",
                                   "KUBEFLOW_TRAINER_SERVER_TOKEN")


class KubeflowCallback(TrainerCallback):
    """Reports progress, time left and metrics to the TrainJob (see the module docstring)."""

    min_interval_s = 5.0  # the controller is not to be flooded: one update per interval at most
    token_ttl_s = 300.0  # the service-account token file is re-read after this long (it rotates)

    def __init__(self) -> None:
        if not is_kubeflow_available():
            raise RuntimeError(f"report_to='kubeflow' needs {SERVER_URL}, which a Kubeflow TrainJob sets (with the "
                               "TrainJobRuntimeStatus feature). Remove 'kubeflow' from report_to outside a TrainJob.")
        self._metrics: dict[str, float] = {}
        self._started: float | None = None
        self._last_sent = -float("inf")
        self._token: tuple[str, float] | None = None  # (token, when read)
        self._active = False

    def _read_token(self) -> str | None:
        now = time.monotonic()
        if self._token is not None and now - self._token[1] < self.token_ttl_s:
            return self._token[0]
        path = os.environ.get(TOKEN_PATH)
        try:
            with open(path or "", encoding="utf-8") as fh:
                self._token = (fh.read().strip(), now)
        except OSError:
            logger.debug("[Kubeflow] no token file at %r", path)
            return None
        return self._token[0]

    def _send(self, progress: int | None, seconds_left: float | None, metrics: dict[str, Any] | None,
              force: bool = False) -> bool:
        """POST one status; True when the server answered 200 (throttled, failed and token-less sends are False)."""
        url = os.environ.get(SERVER_URL)
        now = time.monotonic()
        if not url or (not force and now - self._last_sent < self.min_interval_s):
            return False
        self._last_sent = now
        token = self._read_token()
        if not token:
            return False
        status: dict[str, Any] = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
        if progress is not None:
            status["progressPercentage"] = max(0, min(100, progress))
        if seconds_left is not None:
            status["estimatedRemainingSeconds"] = max(0, int(seconds_left))
        if metrics:
            status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
        request = urllib.request.Request(url, data=json.dumps({"trainerStatus": status}).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        try:
            ca_file = os.environ.get(CA_CERT)
            context = ssl.create_default_context(cafile=ca_file) if ca_file else None
            with urllib.request.urlopen(request, timeout=5, context=context) as response:
                return response.status == 200
        except Exception as err:
            logger.debug("[Kubeflow] status update failed: %s", err)
            return False

    def on_train_begin(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """0% and the planned number of steps."""
        if not state.is_world_process_zero:
            return
        self._active, self._started, self._metrics = True, time.time(), {}
        self._send(0, None, {"total_steps": state.max_steps} if state.max_steps else None, force=True)

    def on_log(self, args: Any, state: TrainerState, control: TrainerControl, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        """Keep the numeric values for the next report."""
        if self._active and state.is_world_process_zero and logs:
            self._metrics.update({k: v for k, v in logs.items() if isinstance(v, (int, float))})

    def on_step_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Progress (at most 99% until the end), time left from the mean step time, step/epoch and the metrics."""
        if not self._active or not state.is_world_process_zero or not state.max_steps or state.max_steps <= 0:
            return
        step = state.global_step
        seconds_left = None
        if self._started is not None and step > 0:
            seconds_left = (time.time() - self._started) / step * (state.max_steps - step)
        metrics: dict[str, Any] = {**self._metrics, "current_step": step, "total_steps": state.max_steps}
        if state.epoch is not None:
            metrics["current_epoch"] = round(state.epoch, 2)
        self._send(min(int(step / state.max_steps * 100), 99), seconds_left, metrics)

    def on_train_end(self, args: Any, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """100%, no time left, the last metrics."""
        if self._active and state.is_world_process_zero:
            self._send(100, 0, self._metrics, force=True)
