"""Getting the weights out of DeepSpeed ZeRO checkpoints (memory estimates: :mod:`.memory_estimates`).

- :func:`get_fp32_state_dict_from_zero_checkpoint` / :func:`load_state_dict_from_zero_checkpoint`: the DeepSpeed
  helpers of the guide's "getting the weights out" recipes (re-exported, imported lazily);
- :func:`zero_to_fp32`: a ``checkpoint-<step>`` folder (or its parent with ``latest``) -> one fp32 weights file;
- the ``trainwell zero-to-fp32`` command, which calls this module, lives in the command line:
  :func:`trainwell.cli.commands.deepspeed_tools.cmd_zero_to_fp32`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import import_deepspeed_module
# torch, safetensors and the pickle check load in the functions: `trainwell zero-to-fp32 --help` imports this module.

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch import nn


def _zero_to_fp32_module() -> Any:
    """DeepSpeed's ``deepspeed.utils.zero_to_fp32`` (on its CPU accelerator where there is no GPU)."""
    return import_deepspeed_module("deepspeed.utils.zero_to_fp32", on_cpu=not _cuda_available(),
                                   missing="Reading ZeRO checkpoints needs DeepSpeed: pip install "
                                   "trainwell[deepspeed], or run the zero_to_fp32.py script DeepSpeed wrote into "
                                   "the checkpoint folder")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None = None, *,
                                             trust_pickles: bool = False) -> dict[str, "torch.Tensor"]:
    """The consolidated fp32 ``state_dict`` of a ZeRO-2/3 checkpoint (on the CPU, any number of saving ranks).

    DeepSpeed unpickles its ``*.pt`` files with ``weights_only=False``; unless ``trust_pickles``, each is first
    scanned against the allow-list of :mod:`trainwell.checkpoint.safe_pickle` (an ``UnsafeCheckpointError`` names
    the file holding anything else).
    """
    _check_zero_checkpoint(checkpoint_dir, tag)
    if not trust_pickles:
        _check_pickles(Path(checkpoint_dir), tag)
    return dict(_zero_to_fp32_module().get_fp32_state_dict_from_zero_checkpoint(str(checkpoint_dir), tag=tag))


def load_state_dict_from_zero_checkpoint(model: "nn.Module", checkpoint_dir: str | os.PathLike,
                                         tag: str | None = None, *, trust_pickles: bool = False) -> "nn.Module":
    """Move ``model`` to the CPU and load the consolidated fp32 weights of the checkpoint into it.

    Afterwards the model is a plain PyTorch module: a DeepSpeed engine built on it must be re-created.
    """
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, trust_pickles=trust_pickles)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def _check_zero_checkpoint(checkpoint_dir: str | os.PathLike, tag: str | None) -> None:
    folder = Path(checkpoint_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such checkpoint folder; pass a checkpoint-<step> folder written with "
                                "a DeepSpeed config")
    if tag is None and not (folder / "latest").is_file():
        raise FileNotFoundError(f"{folder} has no 'latest' file, so it is not a DeepSpeed checkpoint (saved without "
                                "deepspeed=..., or with save_only_model=True); pass tag='global_stepN' if the "
                                "global_step folder exists")


def _check_pickles(folder: Path, tag: str | None) -> None:
    """Scan every ``*.pt`` file DeepSpeed would unpickle (the tag's folder) against the allow-list."""
    from ...checkpoint.safe_pickle import check_pickle_file

    if tag is None:
        tag = (folder / "latest").read_text(encoding="utf-8").strip()
    step_dir = folder / tag
    if not step_dir.is_dir():
        raise FileNotFoundError(f"{step_dir}: no such folder ('latest' or tag names {tag!r})")
    for path in sorted(step_dir.rglob("*.pt")):
        check_pickle_file(path)


def zero_to_fp32(checkpoint_dir: str | os.PathLike, output_file: str | os.PathLike, tag: str | None = None, *,
                 trust_pickles: bool = False) -> Path:
    """Write the checkpoint's consolidated fp32 weights to ``output_file`` (``.safetensors``, else ``torch.save``)."""
    import torch

    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, trust_pickles=trust_pickles)
    out = Path(output_file)
    if out.is_dir():
        out = out / "model.safetensors"
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in state.items()}
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(_untie(state), str(out), metadata={"format": "pt"})
    else:
        torch.save(state, out)
    return out


def _untie(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """safetensors refuses tensors sharing memory: clone the repeats."""
    seen: set[int] = set()
    out = {}
    for key, tensor in state.items():
        ptr = tensor.data_ptr()
        out[key] = tensor.clone() if ptr in seen else tensor
        seen.add(ptr)
    return out


__all__ = [
    "get_fp32_state_dict_from_zero_checkpoint", "load_state_dict_from_zero_checkpoint",
    "zero_to_fp32",
]
