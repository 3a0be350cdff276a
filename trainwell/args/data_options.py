"""The values of the fields transformers 5.2x added or changed that ``__post_init__`` resolves: the training order
(``train_sampling_strategy`` with the seeds' ``group_by_length``), ``include_num_input_tokens_seen``'s modes, the
data loader workers' start method, Trackio's static Space and accelerate's ``parallelism_config``.

Pure data, as :mod:`.validate` (whose ``ArgumentValidation`` calls these); torch is imported only to ask for MPS.
"""

from __future__ import annotations

from typing import Any

TOKENS_SEEN_MODES = ("all", "non_padding", "no")
TRAIN_SAMPLING_STRATEGIES = ("random", "sequential", "group_by_length", "batch_rebalance")


def tokens_seen_mode(value: Any) -> str:
    """``include_num_input_tokens_seen`` as upstream 5.2x holds it: ``"all"``, ``"non_padding"`` or ``"no"`` (True is
    ``"all"``, False or None ``"no"``); anything else is a ``ValueError`` naming the values."""
    if isinstance(value, str) and value.lower() in ("true", "false"):  # the command line's text for a bool
        value = value.lower() == "true"
    if value is None or isinstance(value, bool):
        return "all" if value else "no"
    if value not in TOKENS_SEEN_MODES:
        raise ValueError(f"include_num_input_tokens_seen={value!r} is not valid; choose one of "
                         f"{list(TOKENS_SEEN_MODES)} (or True for 'all', False for 'no').")
    return str(value)


def _mps_available() -> bool:
    """Whether torch sees an Apple MPS device."""
    import torch

    mps = getattr(torch.backends, "mps", None)
    return mps is not None and mps.is_available()


def resolve_data_options(args: Any) -> None:
    """``train_sampling_strategy`` with the seeds' ``group_by_length`` (True beside the default ``"random"`` means
    ``"group_by_length"``; the flag then mirrors the strategy, so code reading either name agrees),
    ``include_num_input_tokens_seen`` as upstream 5.2x's strings, upstream's ``"fork"`` workers on MPS, and
    ``trackio_static_space_id`` (a Space id, False or None)."""
    strategy = args.train_sampling_strategy
    if strategy not in TRAIN_SAMPLING_STRATEGIES:
        raise ValueError(f"train_sampling_strategy={strategy!r} is not valid; choose one of "
                         f"{list(TRAIN_SAMPLING_STRATEGIES)}.")
    # the flag counts only beside the default strategy: a copy of resolved arguments (dataclasses.replace) that
    # changes the strategy then takes the new one, as with upstream's renamed checkpointing fields
    if args.group_by_length and strategy == "random":
        args.train_sampling_strategy = "group_by_length"
    args.group_by_length = args.train_sampling_strategy == "group_by_length"
    args.include_num_input_tokens_seen = tokens_seen_mode(args.include_num_input_tokens_seen)
    if args.dataloader_multiprocessing_context is None and args.dataloader_num_workers > 1 and _mps_available():
        args.dataloader_multiprocessing_context = "fork"  # as upstream: MPS needs forked workers
    if args.trackio_static_space_id is True:
        raise ValueError("trackio_static_space_id=True is not valid: pass a Space id, False (no static Space) or None "
                         "(a default one when the model is pushed to the Hub).")


def check_parallelism_config(config: Any) -> None:
    """accelerate's ``ParallelismConfig``: None (upstream's value when none is given), or one asking for no more than
    the data parallelism trainwell runs under a launcher; tensor/context/sequence parallelism and a sharded data
    dimension are refused with what to use instead."""
    if config is None:
        return
    if isinstance(config, str):
        raise ValueError(f"parallelism_config={config!r} must be an accelerate ParallelismConfig (or a dict of its "
                         "sizes), not text; leave it unset for plain data parallelism.")
    read = config.get if isinstance(config, dict) else (lambda name: getattr(config, name, None))
    asked = {name: read(name) for name in ("tp_size", "cp_size", "sp_size", "dp_shard_size")}
    beyond = {name: size for name, size in asked.items() if size is not None and size > 1}
    if beyond:
        raise NotImplementedError(
            f"parallelism_config asks for {beyond}: trainwell runs data parallelism only (one replica per process "
            "under torchrun); shard a model with fsdp or deepspeed instead, and leave parallelism_config unset.")
