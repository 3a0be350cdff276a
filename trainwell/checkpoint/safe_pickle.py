"""Refuse pickled checkpoint files that hold anything but the known types, before an engine unpickles them.

trainwell reads its own files with ``torch.load(weights_only=True)``. DeepSpeed's ``load_checkpoint`` (and its
``zero_to_fp32``) unpickle their ``*.pt`` files with ``weights_only=False``, and DCP reads ``fsdp_state/.metadata``
with ``pickle.load``: a planted ``__reduce__`` would run code. So before those loads, :func:`check_pickle_file`
*scans* each such file with an unpickler that never calls anything: every global the pickle names must be on an
allow-list (tensors and storages, containers, DCP metadata dataclasses, DeepSpeed's known classes...), and is
replaced by an inert stand-in while scanning. A file naming any other global is refused with
:class:`UnsafeCheckpointError`, naming the file, the global and the opt-in (``trust_checkpoint_pickles=True`` /
``--trust-checkpoint-pickles``) for checkpoints from a trusted source.

For a torch zip archive only its ``data.pkl`` records are scanned (the tensor bytes are not read).
"""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
import importlib
from pathlib import Path
from typing import Any

import torch

from .layout import CheckpointError

OPT_IN = "trust_checkpoint_pickles=True (TrainingArguments) or --trust-checkpoint-pickles (trainwell zero-to-fp32)"

_ALLOWED_EXACT = {
    "collections.OrderedDict", "collections.defaultdict", "collections.deque", "builtins.set", "builtins.frozenset",
    "builtins.slice", "builtins.complex", "builtins.bytearray", "builtins.range", "builtins.object",
    "copyreg._reconstructor", "_codecs.encode", "datetime.datetime", "datetime.timedelta",
    "pathlib.Path", "pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib.WindowsPath", "pathlib.PureWindowsPath",
    "numpy.dtype", "numpy.ndarray", "numpy.core.multiarray._reconstruct", "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar",
    "torch.Size", "torch.Tensor", "torch.device", "torch.dtype", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_device_tensor_from_numpy", "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_sparse_tensor", "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._utils._rebuild_wrapper_subclass", "torch._tensor._rebuild_from_type_v2", "torch.nn.parameter.Parameter",
    "torch.storage.UntypedStorage", "torch.storage.TypedStorage", "torch.serialization._get_layout",
    "torch.distributed.tensor._dtensor_spec.TensorMeta", "torch.distributed.checkpoint.filesystem._StorageInfo",
    # DeepSpeed's checkpoint contents (engine state, ZeRO optimizer state, config enums).
    "deepspeed.runtime.zero.config.ZeroStageEnum", "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler", "deepspeed.utils.tensor_fragment.fragment_address",
    "deepspeed.runtime.zero.offload_config.OffloadDeviceEnum",
    "deepspeed.runtime.config.DtypeEnum",
}
# The classes defined in these modules are plain dataclasses / enums (rebuilding one runs no code of note).
_ALLOWED_CLASS_MODULES = {"torch.distributed.checkpoint.metadata"}
_TORCH_STORAGES = {"DoubleStorage", "FloatStorage", "HalfStorage", "LongStorage", "IntStorage", "ShortStorage",
                   "CharStorage", "ByteStorage", "BoolStorage", "BFloat16Storage", "ComplexDoubleStorage",
                   "ComplexFloatStorage", "QUInt8Storage", "QInt8Storage", "QInt32Storage", "QUInt4x2Storage",
                   "QUInt2x4Storage"}


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file would unpickle an object outside the allow-list (code could run); nothing was loaded."""


def is_allowed(module: str, name: str) -> bool:
    """Whether the global ``module.name`` may appear in a checkpoint pickle."""
    if "." in name:  # a dotted name reaches through attributes (``pkg.os.system``): never needed
        return False
    if f"{module}.{name}" in _ALLOWED_EXACT:
        return True
    if module in _ALLOWED_CLASS_MODULES:
        value = getattr(importlib.import_module(module), name, None)
        return isinstance(value, type) and value.__module__ == module
    if module == "torch":  # dtypes (torch.float32 ...), torch.Size, the typed storages
        value = getattr(torch, name, None)
        return name in _TORCH_STORAGES or isinstance(value, (torch.dtype, torch.layout, torch.memory_format))
    return False


class _Inert:
    """Stand-in for every allowed global while scanning: accepts any construction, state and items."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "_Inert":
        return object.__new__(_Inert)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> "_Inert":
        return _Inert()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        """Accept list items."""

    def extend(self, items: Any) -> None:
        """Accept list items."""

    def add(self, item: Any) -> None:
        """Accept set items."""


class _Scanner(pickle.Unpickler):
    def __init__(self, data: io.BytesIO, path: Path) -> None:
        super().__init__(data)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if not is_allowed(module, name):
            raise UnsafeCheckpointError(
                f"{self.path}: the file holds a pickled {module}.{name}, which is not among the types a checkpoint "
                f"needs (tensors, containers, DCP metadata, DeepSpeed state); loading it could run code, so nothing "
                f"was loaded. If this checkpoint comes from a source you trust, pass {OPT_IN}")
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return None


def _pickles_of(path: Path) -> list[bytes]:
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if n.endswith(".pkl")]
            return [archive.read(n) for n in names]
    return [path.read_bytes()]


def check_pickle_file(path: str | os.PathLike) -> None:
    """Scan ``path`` (a pickle or a torch zip archive) without running it; raise if it names a disallowed global.

    Raises :class:`UnsafeCheckpointError` (disallowed global) or :class:`CheckpointError` (unreadable file).
    """
    path = Path(path)
    try:
        blobs = _pickles_of(path)
    except (OSError, zipfile.BadZipFile) as err:
        raise CheckpointError(f"{path}: cannot read the file ({err}); it is truncated or corrupt") from err
    for blob in blobs:
        try:
            _Scanner(io.BytesIO(blob), path).load()
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # a malformed pickle: the engine's load would fail on it too
            raise CheckpointError(f"{path}: not a readable pickle ({type(err).__name__}: {err}); the file is "
                                  "truncated or corrupt") from err


def load_error(path: Path, what: str, err: BaseException) -> CheckpointError:
    """The error for a failed ``torch.load(weights_only=True)`` of ``path``: a refused global or damage."""
    text = str(err)
    if "Weights only load failed" not in text and "Unsupported global" not in text:
        return CheckpointError(f"{path}: cannot read {what} state ({err}); the file is truncated or corrupt")
    match = re.search(r"Unsupported global: GLOBAL (\S+)", text) or re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    reason = f"it names {match.group(1)}" if match else text.splitlines()[0]
    return UnsafeCheckpointError(
        f"{path}: the {what} state holds objects that safe loading refuses ({reason}); make its state_dict() return "
        f"only tensors, numbers, strings, lists and dicts, or, for a checkpoint you trust, pass {OPT_IN}")


def pickle_files(folder: str | os.PathLike, relative: list[str]) -> list[str]:
    """The entries of ``relative`` that an engine unpickles on resume (DeepSpeed ``*.pt``, DCP ``.metadata``).

    Only files in sub-folders (``global_step<N>/``, ``fsdp_state/``): trainwell's own top-level files are read with
    ``torch.load(weights_only=True)``, which refuses foreign types itself and reports damage per file kind.
    """
    return [rel for rel in relative if "/" in rel and (rel.endswith((".pt", ".pth")) or rel.endswith("/.metadata"))]
