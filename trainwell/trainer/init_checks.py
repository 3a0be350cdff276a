"""What the Trainer checks when it is built: its arguments, datasets, model and ``metric_for_best_model``.

Functions of the :class:`~trainwell.trainer.trainer.Trainer` constructor, each given what it reads: everything
knowable at construction that would otherwise fail after training started is refused here, with the fix.
"""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any, Callable

from torch import nn

from ..utils.option_enums import SaveStrategy
from ..utils.preflight import check_dataset, check_output_dir

logger = logging.getLogger("trainwell.trainer")

# What an evaluation returns without compute_metrics (the loss and the speed/memory figures).
METRICS_WITHOUT_COMPUTE = ("loss", "runtime", "samples_per_second", "steps_per_second", "model_preparation_time",
                           "jit_compilation_time", "tokens_per_second")


def check_args_object(args: Any) -> None:
    """A clear ``TypeError`` for ``args`` given as a dict or a path instead of ``TrainingArguments``."""
    if isinstance(args, Mapping):
        raise TypeError("Trainer(args=...) got a dict; wrap it: `Trainer(args=TrainingArguments(**d))` "
                        "(or build it with HfArgumentParser(TrainingArguments).parse_dict(d)[0]).")
    if isinstance(args, (str, os.PathLike)):
        raise TypeError(f"Trainer(args=...) got the path {os.fspath(args)!r}; pass "
                        f"`args=TrainingArguments(output_dir={os.fspath(args)!r})`.")


def check_before_training(args: Any, train_dataset: Any, eval_dataset: Any) -> None:
    """Everything knowable at construction that would otherwise fail after training started."""
    check_dataset(train_dataset, "train")
    named = eval_dataset.items() if isinstance(eval_dataset, dict) else [(None, eval_dataset)]
    for name, dataset in named:
        check_dataset(dataset, "eval")
        _refuse_empty_eval_dataset(dataset, name)
    _warn_if_evaluation_never_runs(args, eval_dataset)
    if args.eval_strategy is not None and args.eval_strategy != "no" and eval_dataset is None:
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)  # upstream prints the enum's repr
        raise ValueError(  # otherwise upstream's message and type, word for word
            f"You have set `args.eval_strategy` to {strategy} but you didn't pass an `eval_dataset` to `Trainer`. "
            "Either set `args.eval_strategy` to `no` or pass an `eval_dataset`. ")
    check_output_dir(args.output_dir, writing=args.save_strategy != SaveStrategy.NO and args.should_save)


def _refuse_empty_eval_dataset(dataset: Any, name: str | None) -> None:
    """An evaluation dataset with no item would be refused at the first evaluation, after training steps."""
    if dataset is None:
        return
    try:
        size = len(dataset)
    except TypeError:  # an IterableDataset has no length: its emptiness shows only when it is read
        return
    if size == 0:
        label = f"eval_dataset[{name!r}]" if name is not None else "eval_dataset"
        raise ValueError(f"{label} is empty (0 items): an evaluation would have nothing to average. Pass a dataset "
                         "with at least one item, or leave eval_dataset out (and eval_strategy='no').")


def _warn_if_evaluation_never_runs(args: Any, eval_dataset: Any) -> None:
    """``eval_steps`` or an ``eval_dataset`` with ``eval_strategy="no"``: nothing evaluates while training."""
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy not in (None, "no"):
        return
    given = [what for what, set_ in (("eval_steps", args.eval_steps is not None),
                                     ("eval_dataset", eval_dataset is not None)) if set_]
    if given:
        logger.warning("%s given but eval_strategy is 'no': no evaluation runs while training (trainer.evaluate() "
                       "still evaluates on request). Set eval_strategy='steps' (every eval_steps) or 'epoch' to "
                       "evaluate during training.", " and ".join(given))


def check_metric_for_best_model(args: Any, compute_metrics: Any, *, custom_evaluation: bool) -> None:
    """Refuse now a ``metric_for_best_model`` no evaluation can return (upstream fails at the first evaluation,
    after a checkpoint was written). ``custom_evaluation``: the Trainer's class overrides ``evaluate`` or
    ``evaluation_loop``, which may return any metric."""
    name = args.metric_for_best_model
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if not name or compute_metrics is not None or strategy == "no":
        return
    if custom_evaluation or name.removeprefix("eval_") in METRICS_WITHOUT_COMPUTE:
        return
    raise ValueError(
        f"metric_for_best_model={name!r} cannot be computed: without compute_metrics an evaluation returns only "
        f"eval_loss (and its speed). Pass compute_metrics=... returning {{{name.removeprefix('eval_')!r}: ...}}, "
        "or set metric_for_best_model='loss' (the default with load_best_model_at_end).")


def initial_model(model: nn.Module | None, model_init: Callable[..., nn.Module] | None,
                  call_model_init: Callable[[], nn.Module]) -> nn.Module:
    """The model passed in, or the one ``call_model_init()`` builds; a clear error for anything else."""
    if model is None:
        if model_init is None:
            raise ValueError("Trainer needs either a `model` or a `model_init` function")
        model = call_model_init()
    elif model_init is not None:
        warnings.warn("Trainer got both `model` and `model_init`; `model_init` re-creates the model at each "
                      "train() call and overrides `model`", UserWarning, stacklevel=2)
    if isinstance(model, type) and issubclass(model, nn.Module):
        raise TypeError(f"`model` is the class {model.__name__}, not a model: pass an instance, "
                        f"Trainer(model={model.__name__}(...)) (or model_init={model.__name__} to build it per run)")
    if not isinstance(model, nn.Module):
        raise TypeError(f"`model` must be a torch.nn.Module, got {type(model).__name__}")
    return model


def call_model_init(model_init: Callable[..., nn.Module] | None, trial: Any,
                    context: Callable[[], AbstractContextManager[Any]]) -> nn.Module:
    """``Trainer.call_model_init``: ``model_init(trial)`` (``model_init()`` when it takes no argument) inside the
    backend's ``context``; a clear error for a missing ``model_init`` or one returning None."""
    if model_init is None:  # (inspect.signature(None) raised this TypeError)
        raise TypeError("call_model_init needs a model_init: this Trainer was built without one")
    takes_trial = len(inspect.signature(model_init).parameters) >= 1
    with context():
        model = model_init(trial) if takes_trial else model_init()
    if model is None:
        raise RuntimeError("model_init should not return None; it must build and return the nn.Module")
    return model


def _bitsandbytes_quantized(model: Any) -> bool:
    """Whether ``model`` (or the base model under a peft wrapper) holds bitsandbytes 4/8-bit weights."""
    inner = model
    for _ in range(3):  # PeftModel -> LoraModel -> the transformers model
        if getattr(inner, "is_loaded_in_4bit", False) or getattr(inner, "is_loaded_in_8bit", False) or \
                getattr(inner, "quantization_method", None) in ("bitsandbytes", "BitsAndBytes"):
            return True
        inner = getattr(inner, "base_model", None) or getattr(inner, "model", None)
        if inner is None:
            break
    return any(type(p).__name__ in ("Params4bit", "Int8Params") for p in model.parameters())


def is_bitsandbytes_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds bitsandbytes 4/8-bit weights (it is never moved with ``.to``, as upstream)."""
    return _bitsandbytes_quantized(model)


def check_quantized_model(model: nn.Module) -> None:
    """Refuse, with the cause and the fix, a model loaded in 4/8-bit (``BitsAndBytesConfig``, or prepared with peft's
    ``prepare_model_for_kbit_training`` after such a load) where bitsandbytes cannot run: its forward would fail at
    the first step, after the dataset and the optimizer were built."""
    if not _bitsandbytes_quantized(model):
        return
    try:
        from bitsandbytes import cextension

        if "Mock" in type(getattr(cextension, "lib", None)).__name__:  # no native library for this machine
            raise ImportError(f"bitsandbytes found no native library (backend {cextension.BNB_BACKEND!r})")
    except (ImportError, AttributeError) as err:
        raise ValueError(
            f"{type(model).__name__} is loaded in 4/8-bit (bitsandbytes quantization, e.g. load_in_4bit / "
            "BitsAndBytesConfig, prepared with prepare_model_for_kbit_training) but bitsandbytes cannot run here "
            f"({err}). Install it on a machine with a supported accelerator (`pip install bitsandbytes`, CUDA), or "
            "load the model without quantization (drop quantization_config) to train LoRA adapters on "
            "full-precision weights") from err
