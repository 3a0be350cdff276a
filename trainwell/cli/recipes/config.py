"""User recipes: what to train, described in a YAML file by import paths.

Format (every key but ``model`` and a training dataset is optional)::

    model:                      # a factory called as factory(**kwargs); a bare "pkg.mod:fn" string also works
      factory: my_recipe:build_model
      kwargs: {hidden: 128}
    train_dataset:
      factory: my_recipe:build_dataset
      kwargs: {split: train}
    eval_dataset:
      factory: my_recipe:build_dataset
      kwargs: {split: eval}
    # or instead of the two above, one factory returning (train, eval) or {"train": ..., "eval": ...}:
    # datasets: {factory: my_recipe:build_datasets, kwargs: {...}}
    data_collator: my_recipe:collate            # the object itself, or {factory: ..., kwargs: ...} to build it
    compute_metrics: my_recipe:compute_metrics  # same
    args:                                       # any TrainingArguments field
      output_dir: out
      max_steps: 200

Import paths are ``package.module:attribute`` (``attribute`` may be dotted). The folder holding the YAML file
is put on ``sys.path`` first, so a ``my_recipe.py`` next to it is found. A recipe is code: its factories are
imported and called (``factory: "os:system"`` runs a shell command), so load only recipes you would run as a script. Every problem raises
:class:`RecipeError` naming the file, the YAML key and the fix.
"""

from __future__ import annotations

import importlib
import os
import sys
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping
# yaml loads when a recipe file is read: `trainwell train --help` imports this module.

RECIPE_KEYS = ("model", "train_dataset", "eval_dataset", "datasets", "data_collator", "compute_metrics", "args")


class RecipeError(ValueError):
    """A recipe (YAML file, import path or factory result) is invalid; the message says where and how to fix it."""


@dataclass
class Components:
    """The built objects of a recipe, ready for ``Trainer(**components.trainer_kwargs())``."""

    model: Any
    train_dataset: Any = None
    eval_dataset: Any = None
    data_collator: Any = None
    compute_metrics: Callable | None = None
    extras: dict[str, Any] = field(default_factory=dict)  # e.g. the default recipe's vocabulary

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``Trainer`` (collator and metrics only when given)."""
        kwargs: dict[str, Any] = {"model": self.model, "train_dataset": self.train_dataset,
                                  "eval_dataset": self.eval_dataset}
        if self.data_collator is not None:
            kwargs["data_collator"] = self.data_collator
        if self.compute_metrics is not None:
            kwargs["compute_metrics"] = self.compute_metrics
        return kwargs


@dataclass
class Recipe:
    """A recipe: default training arguments and a ``build()`` producing :class:`Components`.

    ``build`` is called after the seed is set, so model initialisation follows ``args.seed``.
    ``finish(components, trainer)``, when given, runs after training and saving (it may write extra files to
    ``trainer.args.output_dir``) and returns extra ``(label, value)`` rows for the run summary.
    ``language_model`` adds the perplexity (``exp(eval_loss)``) to the summary.
    """

    name: str
    args: dict[str, Any]
    build: Callable[[], Components]
    finish: Callable[[Components, Any], list[tuple[str, str]]] | None = None
    language_model: bool = False
    # torch threads for the run unless the user set OMP_NUM_THREADS; None keeps torch's default (one per core).
    # A small model gains little from a second thread and, on a busy machine, loses many times its speed to OpenMP
    # threads spinning for a core they do not get.
    num_threads: int | None = None


def load_object(path: str, *, key: str = "", source: str = "") -> Any:
    """Import ``"package.module:attribute"`` (attribute may be dotted) and return the attribute.

    ``key`` and ``source`` (the YAML key and file) only make the error messages precise.
    """
    where = _where(key, source)
    if not isinstance(path, str) or ":" not in path:
        raise RecipeError(f"{where}: {path!r} is not an import path; write it as 'package.module:function'")
    module_name, _, attr_path = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise RecipeError(
            f"{where}: cannot import module {module_name!r} of {path!r} ({exc}); check the spelling, "
            "or put the module next to the YAML file or on PYTHONPATH"
        ) from None
    obj: Any = module
    for part in attr_path.split("."):
        if not hasattr(obj, part):
            raise RecipeError(f"{where}: module {module_name!r} has no attribute {attr_path!r} (from {path!r})")
        obj = getattr(obj, part)
    return obj


def _where(key: str, source: str) -> str:
    parts = [p for p in (source, f"key '{key}'" if key else "") if p]
    return ", ".join(parts) or "recipe"


def call_factory(spec: Any, *, key: str, source: str = "") -> Any:
    """Build an object from ``"pkg.mod:fn"`` or ``{"factory": "pkg.mod:fn", "kwargs": {...}}`` by calling it."""
    where = _where(key, source)
    if isinstance(spec, str):
        spec = {"factory": spec}
    if not isinstance(spec, Mapping) or "factory" not in spec:
        raise RecipeError(f"{where}: expected {{factory: 'package.module:function', kwargs: {{...}}}}, got {spec!r}")
    unknown = set(spec) - {"factory", "kwargs"}
    if unknown:
        raise RecipeError(f"{where}: unknown entries {sorted(unknown)}; only 'factory' and 'kwargs' are allowed")
    kwargs = spec.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise RecipeError(f"{where}: 'kwargs' must be a mapping of keyword arguments, got {kwargs!r}")
    factory = load_object(spec["factory"], key=key, source=source)
    if not callable(factory):
        raise RecipeError(f"{where}: {spec['factory']!r} is not callable; name a function or class")
    _check_signature(factory, kwargs, spec["factory"], where)
    return factory(**kwargs)


def _check_signature(factory: Callable, kwargs: Mapping[str, Any], path: str, where: str) -> None:
    """Fail early, naming the factory, when the YAML kwargs do not fit its signature."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return
    try:
        signature.bind(**kwargs)
    except TypeError as exc:
        raise RecipeError(f"{where}: kwargs {dict(kwargs)} do not fit {path}{signature}: {exc}") from None


def _object_or_factory(spec: Any, *, key: str, source: str) -> Any:
    """A string names the object itself; a mapping with ``factory`` builds it."""
    if isinstance(spec, Mapping):
        return call_factory(spec, key=key, source=source)
    obj = load_object(spec, key=key, source=source)
    if not callable(obj):
        raise RecipeError(f"{_where(key, source)}: {spec!r} is not callable")
    return obj


def _split_datasets(result: Any, source: str) -> tuple[Any, Any]:
    """Accept ``(train, eval)`` or a mapping with ``train`` and one of ``eval``/``validation``/``test``."""
    if isinstance(result, Mapping) and "train" in result:
        for name in ("eval", "validation", "test"):
            if name in result:
                return result["train"], result[name]
        return result["train"], None
    if isinstance(result, (tuple, list)) and len(result) in (1, 2):
        return result[0], (result[1] if len(result) == 2 else None)
    raise RecipeError(
        f"{_where('datasets', source)}: the factory must return (train, eval) or a mapping with 'train' "
        f"and 'eval', got {type(result).__name__}"
    )


def read_recipe_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check the top level of a recipe YAML file."""
    import yaml

    file = Path(path)
    if not file.is_file():
        raise RecipeError(f"recipe file {str(path)!r} does not exist; pass the path of a YAML recipe")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as exc:
        raise RecipeError(f"{file}: invalid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{file}: the top level must be a mapping with keys {list(RECIPE_KEYS)}")
    unknown = sorted(set(data) - set(RECIPE_KEYS))
    if unknown:
        raise RecipeError(f"{file}: unknown keys {unknown}; the valid keys are {list(RECIPE_KEYS)}")
    if "model" not in data:
        raise RecipeError(f"{file}: missing key 'model' (model: {{factory: 'package.module:function'}})")
    if "datasets" in data and ("train_dataset" in data or "eval_dataset" in data):
        raise RecipeError(f"{file}: give either 'datasets' or 'train_dataset'/'eval_dataset', not both")
    if not isinstance(data.get("args") or {}, dict):
        raise RecipeError(f"{file}: 'args' must be a mapping of TrainingArguments fields")
    return data


def _build_components(data: Mapping[str, Any], source: str) -> Components:
    """Call the factories of a checked recipe mapping."""
    model = call_factory(data["model"], key="model", source=source)
    if "datasets" in data:
        train, evaluation = _split_datasets(call_factory(data["datasets"], key="datasets", source=source), source)
    else:
        train, evaluation = (
            call_factory(data[key], key=key, source=source) if key in data else None
            for key in ("train_dataset", "eval_dataset")
        )
    collator = data.get("data_collator")
    metrics = data.get("compute_metrics")
    return Components(
        model=model, train_dataset=train, eval_dataset=evaluation,
        data_collator=_object_or_factory(collator, key="data_collator", source=source) if collator else None,
        compute_metrics=_object_or_factory(metrics, key="compute_metrics", source=source) if metrics else None,
    )


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read a recipe YAML file; its folder goes first on ``sys.path`` so sibling modules import."""
    data = read_recipe_file(path)
    folder = str(Path(path).resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    source = str(path)
    return Recipe(name=source, args=dict(data.get("args") or {}), build=lambda: _build_components(data, source))
