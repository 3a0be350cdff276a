"""Graceful stop on SIGTERM/SIGINT: finish the current optimizer step, save a checkpoint, exit.

Clusters announce preemption with a signal shortly before killing a job. With SLURM, ask for a warning
signal and requeue the job when it arrives::

    #SBATCH --signal=TERM@120        # SIGTERM 120 s before the time limit
    #SBATCH --requeue
    trap 'scontrol requeue $SLURM_JOB_ID' TERM   # in the batch script, if the job should come back
    srun python train.py --output_dir out ...     # with resume_from_checkpoint=True, a requeued job continues

Inside the training loop::

    with PreemptionGuard() as guard:
        for step in ...:
            ...optimizer step...
            if guard.requested_on_any_rank(device):     # or guard.requested in a single process
                manager.save(step, contents)
                break

The guard only sets a flag in the signal handler (nothing unsafe runs there). A second Ctrl-C while a stop
is already requested raises KeyboardInterrupt, so a user can still force-quit.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..runtime.distributed import any_rank
from ..utils.progress_bars import end_progress_bar_line

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


class TrainingPreempted(SystemExit):
    """Raised by ``Trainer.train()`` after the checkpoint a SIGINT/SIGTERM asked for is saved: the script then ends
    as upstream's does on that signal (exit status 130 or 143, ``code``), instead of running what follows
    ``train()`` as if training had finished (a final evaluation, ``save_model``, ``push_to_hub``).

    A ``SystemExit``: uncaught, Python exits with ``code`` and prints no traceback, and ``except Exception`` does
    not swallow it. (A ``KeyboardInterrupt`` subclass would exit with 1: Python ends by the signal only for the
    exact type.) A script that should go on after a preemption catches it: ``except TrainingPreempted as stop:``
    (``stop.output`` is the ``TrainOutput`` ``train()`` would have returned, ``stop.signal_name`` the signal,
    ``stop.checkpoint`` the folder saved, or None).
    """

    def __init__(self, signal_name: str, step: int, output: Any = None, checkpoint: str | None = None) -> None:
        where = f"checkpoint saved in {checkpoint}" if checkpoint else "no checkpoint saved"
        super().__init__(f"training preempted by {signal_name} at step {step} ({where})")
        self.code = 128 + int(getattr(signal, signal_name, signal.SIGTERM))
        self.signal_name, self.step, self.output, self.checkpoint = signal_name, step, output, checkpoint


class PreemptionGuard:
    """Context manager that turns ``signals`` into a ``requested`` flag instead of killing the process.

    Handlers are installed only in the main thread (Python allows signal handlers nowhere else); in another
    thread the guard is a no-op whose ``requested`` stays False. The previous handlers are restored on exit.
    """

    def __init__(self, signals: tuple[int, ...] | list[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = tuple(signals)
        self.requested = False
        self.signal_received: int | None = None
        self.active = False
        self._previous: dict[int, Any] = {}

    @property
    def signal_name(self) -> str | None:
        """Name of the signal that requested the stop (``"SIGTERM"``), or None."""
        return None if self.signal_received is None else signal.Signals(self.signal_received).name

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested and signum == signal.SIGINT:  # second Ctrl-C: the user really wants out now
            raise KeyboardInterrupt(
                f"second SIGINT after the {self.signal_name} that asked for a checkpoint and a stop: stopping now, "
                "without saving that checkpoint")
        self.requested = True
        self.signal_received = signum
        end_progress_bar_line()  # a bar's line has no newline yet (on a terminal or in a pipe): end it first
        logger.warning("received %s: will save a checkpoint and stop after the current step",
                       signal.Signals(signum).name)

    def __enter__(self) -> PreemptionGuard:
        if threading.current_thread() is not threading.main_thread():
            logger.debug("PreemptionGuard outside the main thread: signals are not intercepted")
            return self
        for sig in self.signals:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)
        self.active = True
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            # None means the previous handler was installed from C; the default is the closest we can restore.
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self.active = False

    def reset(self) -> None:
        """Forget a received signal (e.g. after the checkpoint was saved and training continues)."""
        self.requested = False
        self.signal_received = None

    def requested_on_any_rank(self, device: "torch.device | str | None" = None) -> bool:
        """True when any process of the process group got a signal (a collective: every rank must call it).

        Outside a process group this is :attr:`requested`. ``device`` is where the flag tensor lives (a CUDA
        device under NCCL; CPU under gloo).
        """
        return any_rank([self.requested], device)[0]
