"""Dropping the dataset columns that the model's ``forward`` does not accept (``remove_unused_columns``).

Two paths, as upstream: a ``datasets.Dataset`` (duck-typed: ``column_names`` and ``remove_columns``) loses the
columns up front; any other dataset keeps its examples and :class:`RemoveColumnsCollator` drops the extra keys of
each example just before collating.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ..utils.model_utils import unwrap_for_signature

_LOGGER = logging.getLogger(__name__)

__all__ = [
    "signature_columns",
    "RemoveColumnsCollator",
    "remove_unused_columns_from_dataset",
    "check_labels_present",
    "unwrap_for_signature",
]


def signature_columns(model: Any, label_names: list[str] | None = None) -> list[str]:
    """Names of the model's ``forward`` parameters, then ``label``, ``label_ids`` and ``label_names``.

    As upstream, a ``forward(**kwargs)`` contributes only the name ``kwargs``: set
    ``remove_unused_columns=False`` for such models.
    """
    inner = unwrap_for_signature(model)
    forward = getattr(inner, "forward", inner)
    try:
        names = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"Cannot read the signature of {type(inner).__name__}.forward ({err}); set remove_unused_columns=False."
        ) from err
    columns: list[str] = []
    for name in [*names, "label", "label_ids", *(label_names or [])]:
        if name not in columns:
            columns.append(name)
    return columns


def _ignored_message(ignored: list[str], model_name: str, description: str | None) -> str:
    where = "" if description is None else f"in the {description} set "
    joined = ", ".join(ignored)
    return (
        f"The following columns {where}don't have a corresponding argument in `{model_name}.forward` and have "
        f"been ignored: {joined}. If {joined} are not expected by `{model_name}.forward`,  you can safely "
        "ignore this message."
    )


class RemoveColumnsCollator:
    """Wrap a collator so that each example loses the keys not in ``signature_columns`` before collating.

    The dropped columns are logged once, at INFO level. Examples that are not mappings pass through unchanged.
    """

    def __init__(self, data_collator: Callable[[list[Any]], Any], signature_columns: list[str],
                 logger: logging.Logger | None = None, model_name: str | None = None,
                 description: str | None = None) -> None:
        self.data_collator = data_collator
        self.signature_columns = list(signature_columns)
        self._allowed = set(self.signature_columns)
        self.logger = logger if logger is not None else _LOGGER
        self.model_name = model_name or "model"
        self.description = description
        self.message_logged = False

    def _remove_columns(self, feature: Any) -> Any:
        if not isinstance(feature, Mapping):
            return feature
        if not self.message_logged:
            ignored = [k for k in feature if k not in self._allowed]
            if ignored:
                self.logger.info(_ignored_message(ignored, self.model_name, self.description))
            self.message_logged = True
        return {k: v for k, v in feature.items() if k in self._allowed}

    def __call__(self, features: list[Any]) -> Any:
        """Drop the unused keys of every example, then call the wrapped collator."""
        first = features[0] if features else None
        # Fast path (the common case): the examples carry only columns the model takes, so nothing is copied.
        # Examples of one dataset share their keys (the collators stack the first example's keys), so the first
        # one decides.
        if (type(first) is dict or isinstance(first, Mapping)) and self._allowed.issuperset(first):
            return self.data_collator(features)
        return self.data_collator([self._remove_columns(f) for f in features])


def remove_unused_columns_from_dataset(dataset: Any, signature_columns: list[str],
                                       description: str | None = None, *, model_name: str | None = None,
                                       logger: logging.Logger | None = None) -> Any:
    """Return ``dataset`` without the columns the model does not accept (``datasets.Dataset`` only).

    Objects without ``column_names``/``remove_columns`` are returned unchanged (wrap their collator in
    :class:`RemoveColumnsCollator` instead). Raises ``ValueError`` when no column matches the model.
    """
    column_names = getattr(dataset, "column_names", None)
    if not isinstance(column_names, (list, tuple)) or not callable(getattr(dataset, "remove_columns", None)):
        return dataset
    allowed = set(signature_columns)
    ignored = [c for c in column_names if c not in allowed]
    if len(ignored) == len(column_names):
        where = "" if description is None else f" {description}"
        raise ValueError(
            f"No column of the{where} dataset matches the model's forward arguments: the dataset has columns "
            f"{list(column_names)} and the model's forward accepts {list(signature_columns)}. Rename the columns "
            "to match the forward arguments, or set `remove_unused_columns=False` in `TrainingArguments`."
        )
    if not ignored:
        return dataset
    (logger or _LOGGER).info(_ignored_message(ignored, model_name or "model", description))
    return dataset.remove_columns(ignored)


def check_labels_present(batch: Mapping[str, Any], label_names: list[str]) -> None:
    """Raise ``ValueError`` when a label column the loss needs is missing from ``batch``."""
    missing = [name for name in label_names if name not in batch]
    if not missing:
        return
    quoted = ", ".join(repr(name) for name in missing)
    raise ValueError(
        f"the batch has no {quoted} column (found: {', '.join(map(str, batch.keys())) or 'no columns'}); the model "
        "needs labels to compute a loss: add a 'labels'/'label' column or set label_names."
    )
