"""Which ``TrainingArguments`` fields hold credentials, and the arguments without them.

A checkpoint folder is what people copy, share and upload, so a credential (``hub_token``, ``push_to_hub_token``,
anything named like a token, password, secret, API key or storage options) never goes into it: ``to_dict`` (hence
``training_args.json``, the trackers' configs and the logs) masks it as ``<NAME>``, and the pickled
``training_args.bin`` is written from :func:`without_secrets` (the field set to None). A resume takes the credential
from the new arguments or the environment (``HF_TOKEN``), as a fresh run does.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")

_SECRET_WORDS = ("password", "secret", "credential", "api_key", "storage_options")


def is_secret_field(name: str) -> bool:
    """Whether the field ``name`` holds a credential: a name ending in ``_token`` (``include_tokens_per_second`` is
    not one) or containing password, secret, credential, api_key or storage_options."""
    lowered = name.lower()
    return lowered.endswith("_token") or any(word in lowered for word in _SECRET_WORDS)


def without_secrets(args: T) -> T:
    """``args`` itself when it holds no credential, else a shallow copy with every credential field set to None (what
    goes into ``training_args.bin``); the arguments in use keep theirs."""
    try:
        names = [f.name for f in fields(args)]  # type: ignore[arg-type]
    except TypeError:  # not a dataclass: written as it is
        return args
    secret = [name for name in names if is_secret_field(name) and vars(args).get(name) is not None]
    if not secret:
        return args
    clean = copy.copy(args)
    for name in secret:
        vars(clean)[name] = None
    return clean


__all__ = ["is_secret_field", "without_secrets"]
