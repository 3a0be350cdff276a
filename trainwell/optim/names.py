"""The ``optim`` names trainwell accepts and the parser of the ``optim_args`` string (``"key=value,..."``).

Shared by the factory (:mod:`.factory`) and the optional-package optimizers (:mod:`.extras`); imports no torch.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["SUPPORTED_OPTIMIZERS", "parse_optim_args"]

SUPPORTED_OPTIMIZERS = (
    "adamw_torch",
    "adamw_torch_fused",
    "adamw_hf",
    "adafactor",
    "sgd",
    "adagrad",
    "rmsprop",
    "adamw_apex_fused",
    "adamw_bnb_8bit",
    # backed by optional packages (trainwell.optim.extras): an ImportError names the package when it is missing
    "adamw_8bit", "lion_8bit", "lion_32bit", "paged_adamw_32bit", "paged_adamw_8bit", "paged_lion_32bit",
    "paged_lion_8bit", "rmsprop_bnb", "rmsprop_bnb_8bit", "rmsprop_bnb_32bit", "ademamix", "ademamix_8bit",
    "paged_ademamix_32bit", "paged_ademamix_8bit", "schedule_free_radam", "schedule_free_adamw",
    "schedule_free_sgd", "grokadamw", "galore_adamw", "galore_adamw_8bit", "galore_adafactor", "apollo_adamw",
    "adamw_torch_4bit", "adamw_torch_8bit", "stable_adamw",
)


# --- optim_args ---------------------------------------------------------------------------------------------------


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets, so ``betas=(0.9,0.95)`` stays one item."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part for part in parts if part]


def _parse_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a bare word stays a string


def parse_optim_args(optim_args: str | None) -> dict[str, Any]:
    """Parse the ``optim_args`` training argument, ``"key=value,key2=value2"``, into keyword arguments.

    Values become Python literals where they read as one (``0.9`` -> float, ``true`` -> True,
    ``(0.9,0.95)`` -> tuple, ``none`` -> None), otherwise stay strings. Spaces are ignored.
    """
    if not optim_args:
        return {}
    parsed: dict[str, Any] = {}
    for item in _split_top_level(optim_args.replace(" ", "")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(
                f"cannot parse optim_args item {item!r} in {optim_args!r}; write it as "
                '"key=value,key2=value2", e.g. "momentum=0.9,nesterov=true".'
            )
        parsed[key] = _parse_value(value)
    return parsed
