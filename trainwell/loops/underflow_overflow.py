"""Underflow/overflow detection (``debug="underflow_overflow"``), the upstream ``transformers.debug_utils`` API.

:class:`DebugUnderflowOverflow` puts a forward hook on every module of a model. Each hook records one *frame*: the
module's fully qualified name and class, then the absolute min and max of its own weights, its inputs and its
outputs. The last ``max_frames_to_save`` frames are kept; on the first inf/nan in a weight, input or output the frames
are printed (the report format of the upstream docs) and a ``ValueError`` stops the run. With ``trace_batch_nums``
the listed batches are printed in full instead (detection off for them); ``abort_after_batch_num`` stops after that
batch. The hooks cost a device sync per module (that is the price of the report), so nothing is registered unless the
feature is asked for; :meth:`DebugUnderflowOverflow.remove` takes the hooks off again.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from torch import nn

from ..args.fields import DebugOption

__all__ = ["DebugUnderflowOverflow", "DebugOption", "detect_overflow", "get_abs_min_max"]

_PREFIX = " " * 17


def get_abs_min_max(var: torch.Tensor, ctx: str) -> str:
    """One report line: ``abs min  abs max  ctx`` of a tensor."""
    abs_var = var.detach().abs()
    if abs_var.numel() == 0:
        return f"{'empty':>17} {ctx}"
    return f"{abs_var.min().item():8.2e} {abs_var.max().item():8.2e} {ctx}"


def detect_overflow(var: torch.Tensor, ctx: str) -> bool:
    """Whether ``var`` holds a nan or an inf (printing which, with ``ctx``)."""
    detected = False
    if torch.isnan(var).any().item():
        detected = True
        print(f"{ctx} has nans")
    if torch.isinf(var).any().item():
        detected = True
        print(f"{ctx} has infs")
    return detected


class DebugUnderflowOverflow:
    """Detect the first inf/nan in a model's weights, inputs or outputs and print the frames that led to it.

    Args:
        model: the model to watch (hooks go on every submodule).
        max_frames_to_save: how many forward frames back to report (default 21, as upstream).
        trace_batch_nums: batch numbers (0-based forward passes of ``model``) to print in full; detection is off
            while one of them runs.
        abort_after_batch_num: raise ``ValueError`` once this batch number has finished.
    """

    def __init__(self, model: nn.Module, max_frames_to_save: int = 21, trace_batch_nums: list[int] | None = None,
                 abort_after_batch_num: int | None = None) -> None:
        if max_frames_to_save < 1:
            raise ValueError(f"max_frames_to_save={max_frames_to_save} must be at least 1")
        self.model = model
        self.trace_batch_nums = list(trace_batch_nums or [])
        self.abort_after_batch_num = abort_after_batch_num
        self.frames: collections.deque[str] = collections.deque([], max_frames_to_save)
        self.frame: list[str] = []
        self.batch_number = 0
        self.total_calls = 0
        self.detected_overflow = False
        self.prefix = _PREFIX
        # shared modules are reported under their first name
        self.module_names = {m: name for name, m in model.named_modules()}
        self._handles = [m.register_forward_hook(self.forward_hook) for m in model.modules()]

    def remove(self) -> None:
        """Take the hooks off the model (the detector does nothing afterwards)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    # ------------------------------------------------------------------ frames
    def expand_frame(self, line: str) -> None:
        self.frame.append(line)

    def save_frame(self, frame: str | None = None) -> None:
        if frame is not None:
            self.expand_frame(frame)
        self.frames.append("\n".join(self.frame))
        self.frame = []

    def reset_saved_frames(self) -> None:
        self.frames.clear()

    def trace_frames(self) -> None:
        print("\n".join(self.frames))
        self.frames.clear()

    def dump_saved_frames(self) -> None:
        print(f"\nDetected inf/nan during batch_number={self.batch_number}")
        print(f"Last {len(self.frames)} forward frames:")
        print(f"{'abs min':8} {'abs max':8} metadata")
        print("\n".join(self.frames))
        print("\n\n")
        self.frames.clear()

    def analyse_variable(self, var: Any, ctx: str) -> None:
        if torch.is_tensor(var):
            self.expand_frame(get_abs_min_max(var, ctx))
            if var.is_floating_point() and detect_overflow(var, ctx):
                self.detected_overflow = True
        elif var is None:
            self.expand_frame(f"{'None':>17} {ctx}")
        else:
            self.expand_frame(f"{'not a tensor':>17} {ctx}")

    def batch_start_frame(self) -> None:
        self.expand_frame(f"\n\n{self.prefix} *** Starting batch number={self.batch_number} ***")
        self.expand_frame(f"{'abs min':8} {'abs max':8} metadata")

    def create_frame(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self.expand_frame(f"{self.prefix} {self.module_names.get(module, '?')} {module.__class__.__name__}")
        for name, p in module.named_parameters(recurse=False):
            self.analyse_variable(p, name)
        if isinstance(inputs, tuple):
            for i, x in enumerate(inputs):
                self.analyse_variable(x, f"input[{i}]")
        else:
            self.analyse_variable(inputs, "input")
        if isinstance(output, dict):  # a ModelOutput-like mapping: report its tensors by key
            for key, x in output.items():
                self.analyse_variable(x, f"output[{key!r}]")
        elif isinstance(output, tuple):
            for i, x in enumerate(output):
                if isinstance(x, tuple):
                    for j, y in enumerate(x):
                        self.analyse_variable(y, f"output[{i}][{j}]")
                else:
                    self.analyse_variable(x, f"output[{i}]")
        else:
            self.analyse_variable(output, "output")
        self.save_frame()

    # ------------------------------------------------------------------ the hook
    def forward_hook(self, module: nn.Module, inputs: Any, output: Any) -> None:
        """Record a frame; stop on inf/nan (outside traced batches) or after ``abort_after_batch_num``."""
        last_frame_of_batch = False
        trace_mode = self.batch_number in self.trace_batch_nums
        if trace_mode:
            self.reset_saved_frames()
        if self.total_calls == 0:
            self.batch_start_frame()
        self.total_calls += 1
        if module is self.model:  # the outermost forward finishes last: the batch is complete
            self.batch_number += 1
            last_frame_of_batch = True
        self.create_frame(module, inputs, output)
        if trace_mode:
            self.trace_frames()
        if last_frame_of_batch:
            self.batch_start_frame()
        if self.detected_overflow and not trace_mode:
            self.dump_saved_frames()
            raise ValueError(
                "DebugUnderflowOverflow: inf/nan detected, aborting as there is no point running further. "
                "Please scroll up above this traceback to see the activation values prior to this event."
            )
        if self.abort_after_batch_num is not None and self.batch_number > self.abort_after_batch_num:
            raise ValueError(
                f"DebugUnderflowOverflow: aborting after {self.batch_number} batches due to"
                f" `abort_after_batch_num={self.abort_after_batch_num}` arg"
            )
