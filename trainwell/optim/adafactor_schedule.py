"""``AdafactorSchedule``: the proxy schedule of an Adafactor that sets its own step size (``relative_step=True``).

The Trainer steps a scheduler and logs its ``get_last_lr()``; with Adafactor's relative steps there is no external
rate, so this proxy reports the rate the optimizer computes (``Adafactor._get_lr``), as upstream's does:
``Trainer(..., optimizers=(optimizer, AdafactorSchedule(optimizer)))``.
"""

from __future__ import annotations

from typing import Any

from torch.optim.lr_scheduler import LambdaLR

__all__ = ["AdafactorSchedule", "get_adafactor_schedule"]


class _Constant:
    """A picklable constant multiplier (``LambdaLR`` saves callable objects' state)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self, _: int) -> float:
        return self.value


class AdafactorSchedule(LambdaLR):
    """Reports ``initial_lr`` before the first step, then each group's rate as the Adafactor ``optimizer``
    computes it (groups whose first parameter has no gradient are left out)."""

    def __init__(self, optimizer: Any, initial_lr: float = 0.0) -> None:
        for group in optimizer.param_groups:
            group["initial_lr"] = initial_lr
        super().__init__(optimizer, _Constant(initial_lr))
        for group in optimizer.param_groups:
            del group["initial_lr"]

    def get_lr(self) -> list[float]:  # type: ignore[override]  # torch's returns floats or tensors
        """The optimizer's current rate per group (``base_lrs`` before any step)."""
        opt: Any = self.optimizer  # an Adafactor (trainwell's or upstream's): it has _get_lr
        lrs = [opt._get_lr(group, opt.state[group["params"][0]]) for group in opt.param_groups
               if group["params"][0].grad is not None]
        return lrs or list(self.base_lrs)


def get_adafactor_schedule(optimizer: Any, initial_lr: float = 0.0) -> AdafactorSchedule:
    """An :class:`AdafactorSchedule` for ``optimizer``."""
    return AdafactorSchedule(optimizer, initial_lr)
