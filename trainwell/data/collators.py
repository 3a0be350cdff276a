"""Data collators: turn a list of examples into one batch of tensors.

The names, arguments and behaviour follow upstream ``transformers.data.data_collator`` so that a user's script
ports by changing one import. Collators that pad use ``tokenizer.pad(...)`` when the tokenizer has one (any
``transformers`` tokenizer); any other object (or ``None``) gets a built-in padding that reads
``tokenizer.pad_token_id`` and ``tokenizer.padding_side``.

Built-in padding values per key: ``input_ids``/``decoder_input_ids`` -> the pad token id (0 when unset),
``attention_mask``/``token_type_ids`` and any other key -> 0, ``special_tokens_mask`` -> 1, label sequences
(``labels``, ``label``, ``label_ids``) -> -100. Padding never truncates: a sequence longer than ``max_length``
keeps its length and the batch is padded to it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from torch.utils.data import get_worker_info

LABEL_KEYS = ("label", "label_ids", "labels")
IGNORE_INDEX = -100

DataCollator = Callable[[list[Any]], dict[str, Any]]

__all__ = [
    "DataCollator",
    "DefaultDataCollator",
    "DataCollatorWithPadding",
    "DataCollatorForSeq2Seq",
    "DataCollatorForTokenClassification",
    "DataCollatorForLanguageModeling",
    "default_data_collator",
    "pad_sequences",
]


# --------------------------------------------------------------------------------------------- helpers


def _check_return_tensors(return_tensors: str) -> None:
    if return_tensors not in ("pt", "np"):
        raise ValueError(
            f"return_tensors={return_tensors!r} is not supported by trainwell collators; use 'pt' (torch) or 'np'."
        )


_PLAIN_DICT = {dict}
_LABEL_SOURCES = frozenset({"label", "label_ids"})  # default_data_collator renames them to ``labels``
_Tensor, _torch_stack = torch.Tensor, torch.stack  # module globals: one lookup each per column of every batch


def _to_mappings(features: Sequence[Any]) -> list[Mapping[str, Any]]:
    """Accept mappings or plain objects (dataclasses, namespaces) whose ``__dict__`` holds the fields."""
    if type(features) is list and set(map(type, features)) == _PLAIN_DICT:  # the common case, without the ABCs
        return features
    if len(features) == 0:
        raise ValueError("features is empty: a collator needs at least one example to build a batch.")
    if set(map(type, features)) == _PLAIN_DICT:
        return list(features)
    rows = []
    for f in features:
        if isinstance(f, Mapping):
            rows.append(f)
        elif hasattr(f, "__dict__"):
            rows.append(vars(f))
        else:
            raise TypeError(
                f"A collator got an example of type {type(f).__name__}; examples must be dicts (or objects with "
                "attributes) mapping column names to values: return a dict from the dataset's __getitem__."
            )
    return rows


def _column(rows: list[Mapping[str, Any]], key: str) -> list[Any]:
    """``[row[key] for row in rows]``, gathered in C (the collator runs once per micro-batch, on every example)."""
    return list(map(itemgetter(key), rows))


def _first_scalar(value: Any) -> Any:
    """The first leaf of a (possibly nested) list/array/tensor, used to pick an integer or float dtype."""
    while isinstance(value, (list, tuple)) and len(value) > 0:
        value = value[0]
    return value  # tensors and arrays are typed as a whole by _is_integer_like


def _is_integer_like(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return not (value.is_floating_point() or value.is_complex())
    if isinstance(value, np.ndarray):
        return bool(np.issubdtype(value.dtype, np.integer) or value.dtype == np.bool_)
    return isinstance(value, (bool, int, np.integer, np.bool_))


def _labels_tensor(values: list[Any]) -> torch.Tensor:
    """Stack labels: integer labels become ``long`` (class ids), anything else ``float`` (regression)."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        stacked = torch.stack(values)
        return stacked.long() if _is_integer_like(first) else stacked.float()
    if isinstance(first, np.ndarray):
        stacked = torch.from_numpy(np.stack(values))
        return stacked.long() if _is_integer_like(first) else stacked.float()
    dtype = torch.long if _is_integer_like(_first_scalar(first)) else torch.float
    return torch.tensor(values, dtype=dtype)


def _stack(values: list[Any]) -> torch.Tensor:
    first = values[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(values)
    if isinstance(first, (np.ndarray, np.generic)):
        return torch.from_numpy(np.stack([np.asarray(v) for v in values]))
    return torch.tensor(values)


def _text_in(value: Any) -> str | None:
    """The first string inside ``value`` (a string, or a possibly nested list/tuple of them), else None."""
    while isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, str) else None


def text_column_error(key: str, text: str) -> ValueError:
    """The cause and the fix when column ``key`` holds text that no collator can turn into a tensor."""
    return ValueError(
        f"The dataset's {key!r} column holds text (e.g. {text[:40]!r}), which the data collator cannot turn into a "
        f"tensor: tokenize it first (dataset.map with the tokenizer), drop it (remove_unused_columns=True drops the "
        f"columns the model's forward does not take, or dataset.remove_columns([{key!r}])), or pass a "
        "data_collator that handles it.")


def _unstackable(key: str, err: Exception, first: Any = None) -> ValueError:
    text = _text_in(first)
    if text is not None:
        return text_column_error(key, text)
    return ValueError(
        f"default_data_collator could not stack the values of key {key!r} ({err}); its examples have different "
        "lengths or types: pad them (use DataCollatorWithPadding) or drop the key.")


def _finish(batch: dict[str, Any], return_tensors: str) -> dict[str, Any]:
    if return_tensors == "np":
        return {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


def _reject_string_labels(key: str, value: Any) -> None:
    """Labels must be numbers: a string label would otherwise be dropped, then reported as a missing column."""
    if key in LABEL_KEYS and isinstance(value, str):
        raise ValueError(
            f"The {key!r} column holds strings (e.g. {value!r}); a loss needs class ids. Encode the labels first: "
            f"`dataset = dataset.class_encode_column({key!r})` (datasets), or "
            "`sklearn.preprocessing.LabelEncoder().fit_transform(labels)`; then set the model's number of labels.")


def _rename_labels(batch: Any) -> Any:
    """Upstream renames ``label``/``label_ids`` to ``labels``, the name models' ``forward`` expects."""
    for old in ("label", "label_ids"):
        if old in batch:
            batch["labels"] = batch.pop(old)
    return batch


# --------------------------------------------------------------------------------------------- default


def default_data_collator(features: list[Any], return_tensors: str = "pt") -> dict[str, Any]:
    """Stack every key of the examples into a batch, with no padding.

    ``label``/``label_ids`` become ``labels`` (``long`` for integer labels, ``float`` otherwise); keys whose first
    value is ``None`` or a string are left out. Values may be tensors, numpy arrays, numbers or (equal-length)
    lists. ``return_tensors`` is ``"pt"`` (default) or ``"np"``.
    """
    if return_tensors != "pt":
        _check_return_tensors(return_tensors)
    rows = _to_mappings(features)
    first = rows[0]
    batch: dict[str, Any] = {}
    if "label" in first or "label_ids" in first:
        for label_key in ("label", "label_ids"):
            value = first.get(label_key)
            if value is not None:
                _reject_string_labels(label_key, value)
                batch["labels"] = _labels_tensor(_column(rows, label_key))
                break
    for key, value in first.items():
        if type(value) is _Tensor and key not in _LABEL_SOURCES:  # the common case: straight to the stack
            try:
                batch[key] = _torch_stack(list(map(itemgetter(key), rows)))  # _column, inlined
            except (RuntimeError, ValueError, TypeError) as err:
                raise _unstackable(key, err) from err
            continue
        if value is None or key in _LABEL_SOURCES:
            continue
        if isinstance(value, str):
            _reject_string_labels(key, value)  # a label column of strings is an error; other strings are left out
            continue
        try:
            batch[key] = _stack(_column(rows, key))
        except (RuntimeError, ValueError, TypeError) as err:
            raise _unstackable(key, err, value) from err
    return batch if return_tensors == "pt" else _finish(batch, return_tensors)


default_data_collator.deterministic = True  # type: ignore[attr-defined]  # see BatchLookAhead


@dataclass
class DefaultDataCollator:
    """Class form of :func:`default_data_collator` (upstream ``DefaultDataCollator``)."""

    deterministic: ClassVar[bool] = True  # draws no random numbers: the look-ahead keeps no states

    return_tensors: str = "pt"

    def __call__(self, features: list[Any], return_tensors: str | None = None) -> dict[str, Any]:
        """Collate ``features``; ``return_tensors`` overrides the instance setting for this call."""
        return default_data_collator(features, return_tensors or self.return_tensors)


# --------------------------------------------------------------------------------------------- padding


def _round_up(length: int, multiple: int | None) -> int:
    if multiple is None or multiple <= 0:
        return length
    return ((length + multiple - 1) // multiple) * multiple


def pad_sequences(
    seqs: Sequence[Any],
    padding_value: int | float,
    side: str = "right",
    pad_to_multiple_of: int | None = None,
    *,
    max_length: int | None = None,
) -> torch.Tensor:
    """Pad sequences (lists, arrays or tensors; their first dimension may differ) and stack them.

    The length is the longest sequence, raised to ``max_length`` when given (never truncating), then rounded up
    to a multiple of ``pad_to_multiple_of``. ``side`` is ``"right"`` (default) or ``"left"``.
    """
    if side not in ("right", "left"):
        raise ValueError(f"side={side!r} is not a padding side; use 'right' or 'left'.")
    if len(seqs) == 0:
        raise ValueError("pad_sequences got no sequences to pad.")
    tensors = [s if isinstance(s, torch.Tensor) else torch.as_tensor(np.asarray(s)) for s in seqs]
    if any(t.dim() == 0 for t in tensors):
        raise ValueError("pad_sequences needs sequences, got a scalar; collate scalars with default_data_collator.")
    target = max(t.shape[0] for t in tensors)
    if max_length is not None:
        target = max(target, max_length)
    target = _round_up(target, pad_to_multiple_of)
    dtype = tensors[0].dtype
    out = torch.full((len(tensors), target, *tensors[0].shape[1:]), padding_value, dtype=dtype)
    for row, t in enumerate(tensors):
        n = t.shape[0]
        if side == "right":
            out[row, :n] = t
        else:
            out[row, target - n:] = t
    return out


def _is_sequence_value(value: Any) -> bool:
    if isinstance(value, (torch.Tensor, np.ndarray)):
        return value.ndim >= 1
    return isinstance(value, (list, tuple))


def _pad_value(key: str, tokenizer: Any, label_pad_token_id: int) -> int:
    if key in LABEL_KEYS:
        return label_pad_token_id
    if key in ("input_ids", "decoder_input_ids"):
        pad_id = getattr(tokenizer, "pad_token_id", None)
        return 0 if pad_id is None else int(pad_id)
    if key == "token_type_ids":
        return int(getattr(tokenizer, "pad_token_type_id", 0) or 0)
    if key == "special_tokens_mask":
        return 1
    return 0


def _normalize_padding(padding: bool | str | Any) -> str:
    """Map upstream's ``padding`` values (bool, str or ``PaddingStrategy``) to longest/max_length/do_not_pad."""
    value = getattr(padding, "value", padding)
    if value is True or value == "longest":
        return "longest"
    if value is False or value == "do_not_pad":
        return "do_not_pad"
    if value == "max_length":
        return "max_length"
    raise ValueError(f"padding={padding!r} is not valid; use True/'longest', 'max_length' or False/'do_not_pad'.")


def _target_max_length(strategy: str, max_length: int | None, tokenizer: Any) -> int | None:
    if strategy != "max_length":
        return None
    if max_length is None:
        max_length = getattr(tokenizer, "model_max_length", None)
    if max_length is None:
        raise ValueError("padding='max_length' needs max_length: pass max_length=... to the collator.")
    return int(max_length)


def _pad_key(key: str, values: list[Any], tokenizer: Any, strategy: str, max_length: int | None,
             pad_to_multiple_of: int | None, label_pad_token_id: int) -> torch.Tensor:
    if not _is_sequence_value(values[0]):
        return _labels_tensor(values) if key in LABEL_KEYS else _stack(values)
    if strategy == "do_not_pad":
        try:
            return _stack([v if isinstance(v, torch.Tensor) else torch.as_tensor(np.asarray(v)) for v in values])
        except RuntimeError as err:
            raise ValueError(
                f"key {key!r} has sequences of different lengths and padding is disabled; set padding=True."
            ) from err
    side = getattr(tokenizer, "padding_side", "right") or "right"
    target = _target_max_length(strategy, max_length, tokenizer)
    value = _pad_value(key, tokenizer, label_pad_token_id)
    return pad_sequences(values, value, side, pad_to_multiple_of, max_length=target)


def builtin_pad(
    features: list[Mapping[str, Any]],
    tokenizer: Any = None,
    *,
    padding: bool | str = True,
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
    label_pad_token_id: int = IGNORE_INDEX,
) -> dict[str, torch.Tensor]:
    """Pad every sequence-valued key of ``features`` and stack the rest (no ``transformers`` tokenizer needed).

    ``None`` and string values are left out; keys are padded with the per-key values listed in the module doc.
    """
    rows = _to_mappings(features)
    strategy = _normalize_padding(padding)
    batch: dict[str, torch.Tensor] = {}
    for key, first in rows[0].items():
        _reject_string_labels(key, first)
        if first is None or isinstance(first, str):
            continue
        values = _column(rows, key)
        batch[key] = _pad_key(key, values, tokenizer, strategy, max_length, pad_to_multiple_of, label_pad_token_id)
    return batch


def _has_pad(tokenizer: Any) -> bool:
    return tokenizer is not None and callable(getattr(tokenizer, "pad", None))


def _pad_batch(features: list[Any], tokenizer: Any, padding: bool | str, max_length: int | None,
               pad_to_multiple_of: int | None, return_tensors: str) -> Any:
    """``tokenizer.pad`` when available, else :func:`builtin_pad`."""
    if _has_pad(tokenizer):
        try:
            return tokenizer.pad(
                features,
                padding=padding,
                max_length=max_length,
                pad_to_multiple_of=pad_to_multiple_of,
                return_tensors=return_tensors,
            )
        except (ValueError, TypeError, RuntimeError) as err:
            first = features[0] if features and isinstance(features[0], Mapping) else {}
            text = next(((key, found) for key, value in first.items() if (found := _text_in(value)) is not None),
                        None)
            if text is None:
                raise
            raise text_column_error(*text) from err
    batch = builtin_pad(_to_mappings(features), tokenizer, padding=padding, max_length=max_length,
                        pad_to_multiple_of=pad_to_multiple_of)
    return _finish(batch, return_tensors)


@dataclass
class DataCollatorWithPadding:
    """Pad the examples of a batch to a common length (dynamic padding); ``label``/``label_ids`` -> ``labels``.

    Args:
        tokenizer: a ``transformers`` tokenizer (its ``pad`` is used), or any object with ``pad_token_id`` and
            ``padding_side`` for the built-in padding, or ``None`` (pad id 0, right side).
        padding: ``True``/``"longest"``, ``"max_length"`` or ``False``/``"do_not_pad"``.
        max_length: target length for ``padding="max_length"``.
        pad_to_multiple_of: round the padded length up to this multiple (tensor cores like multiples of 8).
        return_tensors: ``"pt"`` or ``"np"``.
    """

    deterministic: ClassVar[bool] = True  # draws no random numbers: the look-ahead keeps no states

    tokenizer: Any = None
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __call__(self, features: list[Any]) -> Any:
        """Pad and collate ``features``."""
        _check_return_tensors(self.return_tensors)
        batch = _pad_batch(features, self.tokenizer, self.padding, self.max_length, self.pad_to_multiple_of,
                           self.return_tensors)
        return _rename_labels(batch)


# --------------------------------------------------------------------------------------------- seq2seq


def _pad_label_lists(labels: list[Any], tokenizer: Any, padding: bool | str, max_length: int | None,
                     pad_to_multiple_of: int | None, label_pad_token_id: int) -> torch.Tensor:
    strategy = _normalize_padding(padding)
    if strategy == "do_not_pad":
        return _stack([torch.as_tensor(np.asarray(lab)) if not isinstance(lab, torch.Tensor) else lab
                       for lab in labels]).long()
    target = max_length if strategy == "max_length" else None
    side = getattr(tokenizer, "padding_side", "right") or "right"
    return pad_sequences(labels, label_pad_token_id, side, pad_to_multiple_of, max_length=target).long()


@dataclass
class DataCollatorForSeq2Seq:
    """Pad inputs with the tokenizer and labels with ``label_pad_token_id`` (-100, ignored by the loss).

    When ``model`` has ``prepare_decoder_input_ids_from_labels`` (encoder-decoder models), the batch also gets
    ``decoder_input_ids`` built from the padded labels.
    """

    deterministic: ClassVar[bool] = True  # draws no random numbers: the look-ahead keeps no states

    tokenizer: Any = None
    model: Any = None
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX
    return_tensors: str = "pt"

    def __call__(self, features: list[Any], return_tensors: str | None = None) -> Any:
        """Pad and collate ``features``; ``labels`` (or ``label``) sequences are padded separately."""
        return_tensors = return_tensors or self.return_tensors
        _check_return_tensors(return_tensors)
        rows = _to_mappings(features)
        label_name = "label" if "label" in rows[0] else "labels"
        labels = [row.get(label_name) for row in rows] if label_name in rows[0] else None
        if labels is not None and all(lab is None for lab in labels):
            labels = None
        others = [{k: v for k, v in row.items() if k != label_name} for row in rows]
        batch = _pad_batch(others, self.tokenizer, self.padding, self.max_length, self.pad_to_multiple_of, "pt")
        if labels is not None:
            batch["labels"] = _pad_label_lists(labels, self.tokenizer, self.padding, self.max_length,
                                               self.pad_to_multiple_of, self.label_pad_token_id)
            prepare = getattr(self.model, "prepare_decoder_input_ids_from_labels", None)
            if callable(prepare):
                batch["decoder_input_ids"] = prepare(labels=batch["labels"])
        return _finish(dict(batch), return_tensors) if return_tensors == "np" else batch


@dataclass
class DataCollatorForTokenClassification:
    """Pad inputs with the tokenizer and per-token ``labels`` with ``label_pad_token_id`` (-100)."""

    deterministic: ClassVar[bool] = True  # draws no random numbers: the look-ahead keeps no states

    tokenizer: Any = None
    padding: bool | str = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    label_pad_token_id: int = IGNORE_INDEX
    return_tensors: str = "pt"

    def __call__(self, features: list[Any]) -> Any:
        """Pad and collate ``features``; the label sequences are padded to the inputs' padded length."""
        inner = DataCollatorForSeq2Seq(self.tokenizer, None, self.padding, self.max_length,
                                       self.pad_to_multiple_of, self.label_pad_token_id, self.return_tensors)
        batch = inner(features)
        if "labels" in batch and "input_ids" in batch and batch["labels"].ndim == 2:
            batch["labels"] = _pad_labels_to(batch["labels"], batch["input_ids"].shape[1], self.tokenizer,
                                             self.label_pad_token_id)
        return batch


def _pad_labels_to(labels: Any, length: int, tokenizer: Any, pad_id: int) -> Any:
    is_np = isinstance(labels, np.ndarray)
    tensor = torch.from_numpy(labels) if is_np else labels
    if tensor.shape[1] < length:
        side = getattr(tokenizer, "padding_side", "right") or "right"
        tensor = pad_sequences(list(tensor), pad_id, side, max_length=length)
    return tensor.numpy() if is_np else tensor


# --------------------------------------------------------------------------------------------- language modeling


def _mask_token_id(tokenizer: Any) -> int | None:
    token_id = getattr(tokenizer, "mask_token_id", None)
    if token_id is None and getattr(tokenizer, "mask_token", None) is not None:
        convert = getattr(tokenizer, "convert_tokens_to_ids", None)
        token_id = convert(tokenizer.mask_token) if callable(convert) else None
    return None if token_id is None else int(token_id)


def _vocab_size(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        size = getattr(tokenizer, "vocab_size", None)
        if size is None:
            raise ValueError(
                "DataCollatorForLanguageModeling(mlm=True) needs the vocabulary size for random replacement: "
                "give the tokenizer __len__ or a vocab_size attribute."
            ) from None
        return int(size)


def _special_tokens_mask(input_ids: torch.Tensor, tokenizer: Any) -> torch.Tensor:
    get_mask = getattr(tokenizer, "get_special_tokens_mask", None)
    if callable(get_mask):
        rows = [get_mask(ids, already_has_special_tokens=True) for ids in input_ids.tolist()]
        return torch.tensor(rows, dtype=torch.bool)
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is not None:
        special.add(int(pad_id))
    if not special:
        return torch.zeros_like(input_ids, dtype=torch.bool)
    return torch.isin(input_ids, torch.tensor(sorted(special), dtype=input_ids.dtype))


def _collate_ids(examples: list[Any], tokenizer: Any, pad_to_multiple_of: int | None) -> torch.Tensor:
    """Examples that are bare id sequences: pad with the tokenizer's pad id (needed only when lengths differ)."""
    tensors = [e if isinstance(e, torch.Tensor) else torch.as_tensor(np.asarray(e)) for e in examples]
    same = len({t.shape[0] for t in tensors}) == 1
    if same and (pad_to_multiple_of is None or tensors[0].shape[0] % pad_to_multiple_of == 0):
        return torch.stack(tensors)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        raise ValueError(
            "The examples have different lengths and the tokenizer has no pad_token_id: set tokenizer.pad_token "
            "(for example to the eos token) or pad the examples beforehand."
        )
    side = getattr(tokenizer, "padding_side", "right") or "right"
    return pad_sequences(tensors, int(pad_id), side, pad_to_multiple_of)


@dataclass
class DataCollatorForLanguageModeling:
    """Batches for language modeling.

    ``mlm=False`` (causal LM): ``labels`` are a copy of ``input_ids`` with pad positions set to -100 (the model
    shifts them). ``mlm=True`` (masked LM): ``mlm_probability`` of the non-special tokens are chosen; of those
    ``mask_replace_prob`` (0.8) become the mask token, ``random_replace_prob`` (0.1) a random token, the rest
    stay; ``labels`` are -100 except at chosen positions. The masks are drawn exactly as upstream's collator draws
    them (the same calls in the same order): from torch's global stream, so ``set_seed`` (and a restored RNG state
    on resume) reproduces them and the same state gives transformers' masks; with ``seed``, from a generator of
    that seed instead (``seed + worker id`` in a DataLoader worker).
    """

    tokenizer: Any = None
    mlm: bool = True
    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"
    seed: int | None = None

    @property
    def deterministic(self) -> bool:
        """Whether collating draws no random numbers: causal LM batches (``mlm=False``) are not masked."""
        return not self.mlm

    def __post_init__(self) -> None:
        if self.mlm and _mask_token_id(self.tokenizer) is None:
            raise ValueError(
                "This tokenizer does not have a mask token which is necessary for masked language modeling. "
                "You should pass `mlm=False` to train on causal language modeling instead."
            )
        if self.mlm and not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={self.mlm_probability} must be between 0 and 1 (exclusive).")
        for name in ("mask_replace_prob", "random_replace_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name}={getattr(self, name)} must be between 0 and 1.")
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(f"mask_replace_prob + random_replace_prob = "
                             f"{self.mask_replace_prob + self.random_replace_prob} must not exceed 1.")
        self._generator: torch.Generator | None = None
        self._generator_pid: int | None = None

    def _draw_from(self) -> torch.Generator | None:
        """None (torch's global stream) without ``seed``; else this process's generator of ``seed`` (+ worker id)."""
        if self.seed is None:
            return None
        if self._generator is None or self._generator_pid != os.getpid():
            info = get_worker_info()
            self._generator = torch.Generator().manual_seed(self.seed + (info.id if info is not None else 0))
            self._generator_pid = os.getpid()
        return self._generator

    def __call__(self, examples: list[Any]) -> dict[str, Any]:
        """Collate ``examples`` (mappings with ``input_ids``, or bare id sequences) and add ``labels``."""
        _check_return_tensors(self.return_tensors)
        if isinstance(examples[0], Mapping):
            batch = dict(_pad_batch(list(examples), self.tokenizer, True, None, self.pad_to_multiple_of, "pt"))
        else:
            batch = {"input_ids": _collate_ids(list(examples), self.tokenizer, self.pad_to_multiple_of)}
        special = batch.pop("special_tokens_mask", None)
        if self.mlm and special is None and "attention_mask" in batch:
            # Padding is never a masking target, even when the tokenizer's pad id is unknown.
            mask = torch.as_tensor(batch["attention_mask"]) == 0
            special = _special_tokens_mask(batch["input_ids"], self.tokenizer) | mask
        if self.mlm:
            batch["input_ids"], batch["labels"] = self.torch_mask_tokens(batch["input_ids"], special)
        else:
            labels = batch["input_ids"].clone()
            pad_id = getattr(self.tokenizer, "pad_token_id", None)
            if pad_id is not None:
                labels[labels == pad_id] = IGNORE_INDEX
            batch["labels"] = labels
        return _finish(batch, self.return_tensors)

    def torch_mask_tokens(self, inputs: torch.Tensor, special_tokens_mask: Any = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask ``inputs`` (modified in place) and return ``(inputs, labels)``: upstream's draws, in its order."""
        gen = self._draw_from()
        labels = inputs.clone()
        if special_tokens_mask is None:
            special = _special_tokens_mask(labels, self.tokenizer)
        else:
            special = torch.as_tensor(special_tokens_mask).bool()
        probs = torch.full(labels.shape, self.mlm_probability).masked_fill_(special, 0.0)
        masked = torch.bernoulli(probs, generator=gen).bool()
        labels[~masked] = IGNORE_INDEX
        replaced = torch.bernoulli(torch.full(labels.shape, self.mask_replace_prob), generator=gen).bool() & masked
        mask_token_id = _mask_token_id(self.tokenizer)
        if mask_token_id is None:  # only with mlm=False (__post_init__ refuses it with mlm): torch refuses None too
            raise ValueError("This tokenizer does not have a mask token, which masking tokens needs.")
        inputs[replaced] = mask_token_id
        if self.mask_replace_prob == 1 or self.random_replace_prob == 0:
            return inputs, labels
        # of the chosen tokens not masked, the share that gets a random word
        scaled = self.random_replace_prob / (1 - self.mask_replace_prob)
        randomized = torch.bernoulli(torch.full(labels.shape, scaled), generator=gen).bool() & masked & ~replaced
        words = torch.randint(_vocab_size(self.tokenizer), labels.shape, dtype=torch.long, generator=gen)
        inputs[randomized] = words[randomized].to(inputs.dtype)
        return inputs, labels
