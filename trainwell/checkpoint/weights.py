"""Model weight files: safetensors or ``pytorch_model.bin``, single or sharded, with tied weights.

File names and the shard index format are upstream's, so folders are interchangeable with
``transformers`` (``model.safetensors``, ``model-00001-of-00003.safetensors`` +
``model.safetensors.index.json`` = ``{"metadata": {"total_size": ...}, "weight_map": {name: file}}``).

Tied (shared) tensors: safetensors refuses tensors that share memory, so only one name of each group of
aliases is written and the others are recorded in the file metadata (key ``trainwell_aliases``). On load
the aliases are restored from that record and, for files written by other tools, from the model itself
(parameters that share storage in the model are filled from whichever name the file has).

Loading validates everything (file integrity, missing/unexpected keys, shapes) before touching the model,
and reports problems as :class:`~trainwell.checkpoint.layout.CheckpointError` naming the file and keys.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import re
import struct
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save

from .layout import (
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    CheckpointError,
)
from . import digest
from .stream import plan_streamed_shards, write_streamed_file, StreamedWeights
from ..utils.idle_engines import deepspeed_stays_unimported

logger = logging.getLogger(__name__)

ALIASES_METADATA_KEY = "trainwell_aliases"
_MAX_LISTED = 5
_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_re_size = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]I?B|B)?\s*$", re.IGNORECASE)
_re_weight_file = re.compile(
    r"^(model(-\d{5}-of-\d{5})?\.safetensors|pytorch_model(-\d{5}-of-\d{5})?\.bin"
    r"|model\.safetensors\.index\.json|pytorch_model\.bin\.index\.json)$"
)


def parse_size(size: int | str) -> int:
    """Bytes of a size such as ``5GB`` (10**9), ``500MB``, ``2GiB`` (2**30) or an int."""
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    match = _re_size.match(size) if isinstance(size, str) else None
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(
            f"max_shard_size={size!r} is not a size: pass a positive int (bytes) "
            "or a string like '5GB', '500MB', '2GiB'"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[(match.group(2) or "").upper()])


def _listed(names: Any) -> str:
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:_MAX_LISTED])
    return shown + (f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


# ----------------------------------------------------------------------------------------------- saving


def _alias_key(tensor: "torch.Tensor") -> tuple:
    if hasattr(tensor, "to_local"):  # a DTensor (FSDP2 parameter) has no storage; its local shard does
        tensor = tensor.to_local()
    storage = tensor.untyped_storage()
    return (tensor.device, storage.data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def dedupe_shared_tensors(state_dict: Mapping[str, "torch.Tensor"]) -> tuple[dict[str, "torch.Tensor"], dict[str, str]]:
    """Split a state dict into ``(tensors to write, {alias: kept name})``.

    Names that view exactly the same memory (tied weights) keep the first name; the others become aliases.
    Tensors that are non-contiguous or overlap another kept tensor's storage are cloned, since safetensors
    accepts neither.
    """
    kept: dict[str, Any] = {}
    aliases: dict[str, str] = {}
    by_key: dict[tuple, str] = {}
    storage_users: dict[tuple, int] = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        key = _alias_key(tensor)
        if key in by_key:
            aliases[name] = by_key[key]
            continue
        by_key[key] = name
        kept[name] = tensor
        storage_key = (tensor.device, tensor.untyped_storage().data_ptr())
        storage_users[storage_key] = storage_users.get(storage_key, 0) + 1
    for name, tensor in kept.items():
        shared = storage_users[(tensor.device, tensor.untyped_storage().data_ptr())] > 1
        if shared or not tensor.is_contiguous():
            kept[name] = tensor.contiguous().clone()
    return kept, aliases


def _plan_shards(tensors: Mapping[str, "torch.Tensor"], max_bytes: int) -> list[list[str]]:
    shards: list[list[str]] = [[]]
    current = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and current + size > max_bytes:
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += size
    return shards


def _shard_name(single: str, index: int, count: int) -> str:
    stem, ext = single.rsplit(".", 1)
    return single if count == 1 else f"{stem}-{index:05d}-of-{count:05d}.{ext}"


def _write_file(tensors: dict, path: Path, safe: bool, metadata: dict[str, str]) -> None:
    if safe:  # the bytes are hashed before they are written: the checkpoint marker records the checksum
        digest.write_bytes(path, save(tensors, metadata=metadata))
    else:
        digest.torch_save(tensors, path)


def _remove_stale_weight_files(folder: Path, written: set[str]) -> None:
    for child in folder.iterdir():
        if child.is_file() and _re_weight_file.match(child.name) and child.name not in written:
            child.unlink()


def _save_state_dict(state_dict: Mapping[str, "torch.Tensor"], folder: Path, *, safe: bool,
                     max_bytes: int, metadata: dict[str, str] | None) -> list[Path]:
    if safe:
        tensors, aliases = dedupe_shared_tensors(state_dict)
    else:  # torch.save keeps shared storage itself
        tensors, aliases = {k: v.detach() for k, v in state_dict.items()}, {}
    file_meta = {"format": "pt", **(metadata or {})}
    if aliases:
        file_meta[ALIASES_METADATA_KEY] = json.dumps(aliases, sort_keys=True)
    single = SAFE_WEIGHTS_NAME if safe else WEIGHTS_NAME
    shards = _plan_shards(tensors, max_bytes)
    written, weight_map = [], {}
    for i, names in enumerate(shards, start=1):
        path = folder / _shard_name(single, i, len(shards))
        _write_file({n: tensors[n] for n in names}, path, safe, file_meta)
        weight_map.update({n: path.name for n in names})
        written.append(path)
    if len(shards) > 1:
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index = {"metadata": {"total_size": total, **({"aliases": aliases} if aliases else {})},
                 "weight_map": dict(sorted(weight_map.items()))}
        index_path = folder / (SAFE_WEIGHTS_INDEX_NAME if safe else WEIGHTS_INDEX_NAME)
        index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        written.append(index_path)
    _remove_stale_weight_files(folder, {p.name for p in written})
    return written


def _save_streamed(stream: Any, folder: Path, *, max_bytes: int, metadata: dict[str, str] | None) -> list[Path]:
    """Write a :class:`~trainwell.checkpoint.stream.StreamedWeights` tensor by tensor (safetensors, sharded as
    :func:`_save_state_dict` shards); the rest of the stream is drained on error so every rank's gathers match."""
    file_meta = {"format": "pt", **(metadata or {})}
    if stream.aliases:
        file_meta[ALIASES_METADATA_KEY] = json.dumps(stream.aliases, sort_keys=True)
    shards = plan_streamed_shards(stream.entries, max_bytes)
    written, weight_map = [], {}
    try:
        for i, indices in enumerate(shards, start=1):
            path = folder / _shard_name(SAFE_WEIGHTS_NAME, i, len(shards))
            write_streamed_file(stream, indices, path, file_meta)
            weight_map.update({stream.entries[j].name: path.name for j in indices})
            written.append(path)
    finally:
        stream.drain()
    if len(shards) > 1:
        total = sum(entry.nbytes for entry in stream.entries)
        aliases = stream.aliases
        index = {"metadata": {"total_size": total, **({"aliases": aliases} if aliases else {})},
                 "weight_map": dict(sorted(weight_map.items()))}
        index_path = folder / SAFE_WEIGHTS_INDEX_NAME
        index_path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        written.append(index_path)
    _remove_stale_weight_files(folder, {p.name for p in written})
    return written


def _save_config(model: Any, folder: Path) -> None:
    """The config (and generation config) of a ``transformers`` model whose weights are streamed."""
    for name in ("config", "generation_config"):
        config = getattr(model, name, None)
        if config is not None and hasattr(config, "save_pretrained"):
            if name == "generation_config" and not getattr(model, "can_generate", lambda: False)():
                continue
            config.save_pretrained(folder)


def save_model_weights(model_or_state_dict: "nn.Module | Mapping[str, torch.Tensor]", folder: str | os.PathLike,
                       *, safe_serialization: bool | None = True, max_shard_size: int | str = "5GB",
                       metadata: dict[str, str] | None = None,
                       state_dict: "Mapping[str, torch.Tensor] | Any | None" = None) -> list[Path]:
    """Write a model's weights into ``folder``; returns the files written.

    ``model_or_state_dict`` is an ``nn.Module`` or a state dict. ``state_dict`` (optional) replaces
    ``model.state_dict()`` (for sharded backends that gathered the full weights themselves). A model with
    ``save_pretrained`` (a ``transformers``/``peft`` model) saves itself, config included, through
    ``save_pretrained(folder, state_dict=..., safe_serialization=...)``. Otherwise the weights go to
    ``model.safetensors`` (or ``pytorch_model.bin`` when ``safe_serialization`` is False or None), split into
    ``model-0000k-of-0000n.safetensors`` + index once they exceed ``max_shard_size`` ("5GB", "500MB", bytes).
    Weight files of an earlier save in ``folder`` that this save did not write are removed.

    ``state_dict`` may also be a :class:`~trainwell.checkpoint.stream.StreamedWeights` (a sharded model gathered
    one tensor at a time): its tensors are written as they arrive (safetensors; ``torch.save`` needs them all at
    once), a ``transformers`` model's config next to them.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    max_bytes = parse_size(max_shard_size)
    model = None if isinstance(model_or_state_dict, Mapping) else model_or_state_dict
    if isinstance(state_dict, StreamedWeights):
        if safe_serialization:
            if model is not None:
                _save_config(model, folder)
            return _save_streamed(state_dict, folder, max_bytes=max_bytes, metadata=metadata)
        state_dict = state_dict.materialize()
    save_pretrained = getattr(model, "save_pretrained", None)
    if model is not None and save_pretrained is not None:
        sd = state_dict if state_dict is not None else model.state_dict()
        with deepspeed_stays_unimported():  # transformers' unwrap would import an unused DeepSpeed (5 s)
            save_pretrained(folder, state_dict=sd, safe_serialization=safe_serialization)
        return sorted(p for p in folder.iterdir() if p.is_file())
    if state_dict is None:
        state_dict = model_or_state_dict if isinstance(model_or_state_dict, Mapping) else model_or_state_dict.state_dict()
    return _save_state_dict(state_dict, folder, safe=bool(safe_serialization), max_bytes=max_bytes, metadata=metadata)


# ---------------------------------------------------------------------------------------------- loading


def _check_safetensors_header(path: Path) -> None:
    """Raise CheckpointError when the file is shorter than its header says (a truncated copy or save)."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: file is truncated ({size} bytes; not even a safetensors header)")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise CheckpointError(f"{path}: file is truncated ({size} bytes, header alone claims {8 + header_len})")
        try:
            header = json.loads(handle.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: corrupt safetensors header ({err})") from err
    ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
    expected = 8 + header_len + max(ends, default=0)
    if size < expected:
        raise CheckpointError(f"{path}: file is truncated ({size} bytes, its header describes {expected})")


def _read_safetensors(path: Path) -> tuple[dict[str, "torch.Tensor"], dict[str, str]]:
    _check_safetensors_header(path)
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            meta = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as err:  # SafetensorError is not importable under a stable name across versions
        raise CheckpointError(f"{path}: cannot read safetensors file ({err}); the file is corrupt") from err
    return tensors, meta


def _read_bin(path: Path) -> dict[str, "torch.Tensor"]:
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as err:
        raise CheckpointError(f"{path}: cannot read weights file ({err}); the file is truncated or corrupt") from err
    if not isinstance(loaded, Mapping):
        raise CheckpointError(f"{path}: expected a state dict (name -> tensor), found {type(loaded).__name__}")
    return dict(loaded)


def _read_weight_file(path: Path) -> tuple[dict[str, "torch.Tensor"], dict[str, str]]:
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file is missing")
    return _read_safetensors(path) if path.suffix == ".safetensors" else (_read_bin(path), {})


def _apply_aliases(state: dict, origin: dict, meta: Mapping[str, Any], source: Path) -> None:
    raw = meta.get(ALIASES_METADATA_KEY)
    aliases = raw if isinstance(raw, dict) else json.loads(raw) if raw else {}
    for alias, kept in aliases.items():
        if kept in state and alias not in state:
            state[alias] = state[kept]
            origin[alias] = origin.get(kept, source)


def _read_index(index_path: Path) -> tuple[dict[str, str], dict]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map = index["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(
            f"{index_path}: unreadable shard index ({err!r}); expected {{'weight_map': ...}}") from err
    return weight_map, index.get("metadata") or {}


def _read_sharded(index_path: Path) -> tuple[dict, dict]:
    weight_map, index_meta = _read_index(index_path)
    state, origin = {}, {}
    for shard in sorted(set(weight_map.values())):
        path = index_path.parent / shard
        tensors, meta = _read_weight_file(path)
        wanted = [k for k, f in weight_map.items() if f == shard]
        absent = [k for k in wanted if k not in tensors]
        if absent:
            raise CheckpointError(f"{path}: keys listed in {index_path.name} are not in this shard: {_listed(absent)}")
        for key in wanted:
            state[key], origin[key] = tensors[key], path
        _apply_aliases(state, origin, meta, path)
    _apply_aliases(state, origin, {ALIASES_METADATA_KEY: index_meta.get("aliases") or {}}, index_path)
    return state, origin


def find_weights_file(folder: str | os.PathLike) -> Path:
    """The index or single weights file of ``folder`` (safetensors preferred over .bin)."""
    folder = Path(folder)
    for name in (SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME):
        if (folder / name).is_file():
            return folder / name
    raise CheckpointError(
        f"{folder}: no model weights found; expected one of {SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, "
        f"{WEIGHTS_NAME}, {WEIGHTS_INDEX_NAME} (was the checkpoint saved by a sharded backend or deleted?)"
    )


def read_weights(folder: str | os.PathLike) -> tuple[dict[str, "torch.Tensor"], dict[str, Path]]:
    """Load every tensor of ``folder`` on the CPU: ``(state dict, {key: file it came from})``."""
    main = find_weights_file(folder)
    if main.name.endswith(".index.json"):
        return _read_sharded(main)
    tensors, meta = _read_weight_file(main)
    origin = {key: main for key in tensors}
    _apply_aliases(tensors, origin, meta, main)
    return tensors, origin


def load_state_dict_from_folder(folder: str | os.PathLike) -> dict[str, "torch.Tensor"]:
    """The full state dict stored in ``folder`` (any supported format), tied aliases restored, on the CPU."""
    return read_weights(folder)[0]


def _model_alias_groups(expected: Mapping[str, "torch.Tensor"]) -> list[list[str]]:
    groups: dict[tuple, list[str]] = {}
    for name, tensor in expected.items():
        if tensor.device.type != "meta":
            groups.setdefault(_alias_key(tensor), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _reshapes_on_load(model: "nn.Module") -> bool:
    """Whether ``model``'s own class (not torch's, transformers' or peft's) overrides ``load_state_dict``: such a
    model may resize a buffer to the saved shape there (a log of the batches seen, a growing memory), and upstream
    hands it the saved tensors as they are, so its shapes are its own to check."""
    for cls in type(model).__mro__:
        if cls is nn.Module:
            return False
        if "load_state_dict" in vars(cls):
            return cls.__module__.split(".")[0] not in ("torch", "transformers", "peft", "trainwell")
    return False


def match_state_dict(model: "nn.Module", state: dict[str, "torch.Tensor"], origin: Mapping[str, Path],
                     *, strict: bool = True, source: Path | str = "") -> dict[str, "torch.Tensor"]:
    """Check ``state`` against ``model`` without modifying it; returns the state dict ready to load.

    Keys the model ties together are filled from whichever one the file has. Raises :class:`CheckpointError`
    for shape mismatches, and (when ``strict``) for missing or unexpected keys, naming files and keys.
    """
    expected = model.state_dict()
    state = dict(state)
    for group in _model_alias_groups(expected):
        present = [n for n in group if n in state]
        for name in group:
            if present and name not in state:
                state[name] = state[present[0]]
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if strict and (missing or unexpected):
        parts = ([f"{len(missing)} missing keys ({_listed(missing)})"] if missing else []) + (
            [f"{len(unexpected)} unexpected keys ({_listed(unexpected)})"] if unexpected else [])
        raise CheckpointError(
            f"{source}: weights do not match the model: {'; '.join(parts)}. Load into the same model "
            "architecture that was saved, or pass strict=False to load the matching keys only"
        )
    for key, tensor in state.items():
        if key in expected and tuple(tensor.shape) != tuple(expected[key].shape) and not _reshapes_on_load(model):
            raise CheckpointError(
                f"{origin.get(key, source)}: key {key!r} has shape {tuple(tensor.shape)} in the file but "
                f"{tuple(expected[key].shape)} in the model; the checkpoint belongs to a different model configuration"
            )
    if not strict and (missing or unexpected):
        logger.warning("loading %s: ignored %d missing and %d unexpected keys", source, len(missing), len(unexpected))
    return {k: v for k, v in state.items() if k in expected}


def load_model_weights(model: "nn.Module", folder: str | os.PathLike, *, strict: bool = True) -> None:
    """Load the weights saved in ``folder`` (single, sharded or .bin) into ``model``.

    Everything is read and validated first, so a truncated or corrupt file, missing/unexpected keys
    (when ``strict``) or a shape mismatch raise :class:`CheckpointError` before the model is modified.
    """
    state, origin = read_weights(folder)
    ready = match_state_dict(model, state, origin, strict=strict, source=find_weights_file(folder))
    model.load_state_dict(ready, strict=strict)


# ----------------------------------------------------------------------------------------- PEFT adapters

ADAPTER_SAFE_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_WEIGHTS_NAME = "adapter_model.bin"


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a ``peft`` model (a ``PeftModel`` or ``PeftMixedModel``), read without importing peft."""
    return any(cls.__module__.split(".")[0] == "peft" and cls.__name__ in ("PeftModel", "PeftMixedModel")
               for cls in type(model).__mro__)


def has_full_weights(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a whole model's weights (single, sharded, safetensors or .bin)."""
    folder = Path(folder)
    return any((folder / name).is_file()
               for name in (SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME))


def _has_adapter_file(folder: Path) -> bool:
    return (folder / ADAPTER_SAFE_WEIGHTS_NAME).is_file() or (folder / ADAPTER_WEIGHTS_NAME).is_file()


def adapter_subfolders(folder: str | os.PathLike) -> list[str]:
    """The sub-folders of ``folder`` holding one adapter each (peft saves a model with several adapters so)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(child.name for child in folder.iterdir() if child.is_dir() and _has_adapter_file(child))


def has_adapter_weights(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds PEFT adapter weights (``adapter_model.safetensors``/``.bin``, or sub-folders)."""
    return _has_adapter_file(Path(folder)) or bool(adapter_subfolders(folder))


def load_adapter_weights(model: Any, folder: str | os.PathLike, *, is_trainable: bool = True) -> None:
    """Load the adapter(s) saved in ``folder`` into the peft ``model`` in place, as upstream's Trainer does.

    The active adapter is loaded from ``folder`` itself; adapters saved in sub-folders (several adapters) under
    their folder's name, the active one trainable. The adapter parameters are filled in place, so an optimizer
    built over them keeps its references. Raises :class:`CheckpointError` when ``folder`` holds no adapter.
    """
    folder = Path(folder)
    if not hasattr(model, "load_adapter") or not hasattr(model, "active_adapters"):
        raise CheckpointError(f"{folder}: holds PEFT adapter weights but {type(model).__name__} has no load_adapter; "
                              "install peft >= 0.7 and train the same PeftModel that was saved")
    active_adapters = list(model.active_adapters)
    if len(active_adapters) > 1:
        logger.warning("Several active adapters %s: only the first one is resumed as trainable", active_adapters)
    active = active_adapters[0]
    subfolders = adapter_subfolders(folder)
    if not _has_adapter_file(folder) and not subfolders:
        raise CheckpointError(f"{folder}: no adapter weights found; expected {ADAPTER_SAFE_WEIGHTS_NAME} or "
                              f"{ADAPTER_WEIGHTS_NAME} (was the checkpoint saved from another model?)")
    if subfolders:
        if _has_adapter_file(folder):
            model.load_adapter(str(folder), "default", is_trainable=is_trainable and active == "default")
        for name in subfolders:
            model.load_adapter(str(folder / name), name, is_trainable=is_trainable and name == active)
        model.set_adapter(active)
    else:
        model.load_adapter(str(folder), active, is_trainable=is_trainable)


def load_checkpoint_weights(model: "nn.Module", folder: str | os.PathLike, *, strict: bool = True) -> None:
    """Load a checkpoint's weights into ``model``: the whole model's (validated, strict) when ``folder`` has them,
    else a peft model's adapters (``adapter_model.safetensors``), trainable."""
    if not has_full_weights(folder) and is_peft_model(model) and has_adapter_weights(folder):
        load_adapter_weights(model, folder, is_trainable=True)
        return
    load_model_weights(model, folder, strict=strict)
