"""``Seq2SeqTrainer``: the Trainer whose evaluation can generate sequences (``predict_with_generate``)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data.samplers import LengthGroupedSampler, infer_lengths
from ..loops.eval_loop import _float32_outputs
from ..utils.model_utils import unwrap_model
from .trainer import Trainer
from ..utils.outputs import PredictionOutput
from ..backends.deepspeed.config import is_deepspeed_zero3_enabled

PAD_INDEX = -100
# GenerationConfig's max_length when neither the model's config nor the call sets one
DEFAULT_MAX_LENGTH = 20


def _pad_to_length(tensor: torch.Tensor, length: int, pad_value: int) -> torch.Tensor:
    """Right-pad the last dimension of ``tensor`` to ``length`` with ``pad_value``."""
    if tensor.shape[-1] >= length:
        return tensor
    padded = tensor.new_full((*tensor.shape[:-1], length), pad_value)
    padded[..., : tensor.shape[-1]] = tensor
    return padded


def _generation_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs ``generate`` gets: all but the labels, and without ``decoder_input_ids`` /
    ``decoder_attention_mask`` when those were made from the labels (same shape), so that generation starts fresh
    instead of continuing the padded targets; decoder ids of another shape are a prompt, and kept."""
    out = {k: v for k, v in inputs.items() if k != "labels"}
    labels, decoder_ids = inputs.get("labels"), inputs.get("decoder_input_ids")
    if labels is not None and decoder_ids is not None and getattr(labels, "shape", None) == decoder_ids.shape:
        out.pop("decoder_input_ids")
        out.pop("decoder_attention_mask", None)
    return out


def _padded_length(generation_config: Any, gen_kwargs: dict[str, Any], length: int) -> int | None:
    """The width generated ids and labels are padded to (upstream's rule): the model's generation-config
    ``max_length`` (20 when unset: ``GenerationConfig``'s default), else ``max_new_tokens + 1``; without a
    generation config (a model with its own ``generate``), the ``max_length`` given to generate."""
    if generation_config is None:
        return gen_kwargs.get("max_length")
    get = generation_config.get if isinstance(generation_config, dict) else \
        lambda key: getattr(generation_config, key, None)
    max_length = get("max_length")
    max_length = DEFAULT_MAX_LENGTH if max_length is None else max_length
    if length < max_length:
        return max_length
    max_new_tokens = get("max_new_tokens")
    if max_new_tokens is not None and length < max_new_tokens + 1:
        return max_new_tokens + 1
    return None


class Seq2SeqTrainer(Trainer):
    """A Trainer for sequence-to-sequence models.

    With ``Seq2SeqTrainingArguments(predict_with_generate=True)``, ``evaluate``/``predict`` call ``model.generate``
    and hand the generated token ids (padded) to ``compute_metrics``. Generation settings come from the
    ``**gen_kwargs`` of ``evaluate``/``predict``, else ``generation_max_length`` / ``generation_num_beams``.
    """

    _gen_kwargs: dict[str, Any] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # as upstream: args.generation_config replaces the model's generation_config (used by generate)
        # (read with getattr: a Seq2SeqTrainer may be given plain TrainingArguments, which lack the field)
        generation_config = getattr(self.args, "generation_config", None)
        if generation_config is not None and self.model is not None:
            unwrap_model(self.model).generation_config = self.load_generation_config(generation_config)

    @staticmethod
    def load_generation_config(gen_config_arg: Any) -> Any:
        """A ``GenerationConfig`` from ``Seq2SeqTrainingArguments.generation_config``: a GenerationConfig (copied),
        a dict, a ``generation_config.json`` file or a folder holding one. Without transformers installed, a dict."""
        if not isinstance(gen_config_arg, (str, os.PathLike, dict)):
            return copy.deepcopy(gen_config_arg)  # a GenerationConfig (or a compatible object)
        if isinstance(gen_config_arg, dict):
            values = dict(gen_config_arg)
        else:
            path = Path(gen_config_arg)
            file = path / "generation_config.json" if path.is_dir() else path
            if not file.is_file():
                raise FileNotFoundError(
                    f"generation_config={os.fspath(gen_config_arg)!r}: no such file, and no generation_config.json in "
                    "such a folder (trainwell loads local files only; download the model's folder first).")
            values = json.loads(file.read_text())
        try:
            from transformers import GenerationConfig
        except ImportError:
            return values
        config = GenerationConfig(**values)
        try:
            config.validate(strict=True)
        except ValueError as exc:
            raise ValueError(f"{exc}\n\nFix these issues in generation_config to train your model.") from exc
        return config

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        """``sortish_sampler``: batches of roughly sorted lengths (the length-grouped sampler), else the Trainer's."""
        if not getattr(self.args, "sortish_sampler", False) or self.args.group_by_length:
            return super()._get_train_sampler(train_dataset)
        dataset = self.train_dataset if train_dataset is None else train_dataset
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        lengths = infer_lengths(dataset, length_column_name=self.args.length_column_name)
        return LengthGroupedSampler(self._train_batch_size * self.args.gradient_accumulation_steps, lengths=lengths,
                                    seed=seed, num_replicas=self.args.world_size, rank=self.args.process_index)

    def _generation_defaults(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        gen_kwargs = dict(gen_kwargs)
        config = getattr(unwrap_model(self.model), "generation_config", None) if self.model is not None else None
        if isinstance(config, dict):  # generation_config loaded without transformers: the defaults of generate
            gen_kwargs = {**config, **{k: v for k, v in gen_kwargs.items() if v is not None}}
        if gen_kwargs.get("max_length") is None and gen_kwargs.get("max_new_tokens") is None:
            max_length = getattr(self.args, "generation_max_length", None)
            if max_length is not None:
                gen_kwargs["max_length"] = max_length
        num_beams = getattr(self.args, "generation_num_beams", None)
        if gen_kwargs.get("num_beams") is None and num_beams is not None:
            gen_kwargs["num_beams"] = num_beams
        return gen_kwargs

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None,
                 metric_key_prefix: str = "eval", **gen_kwargs: Any) -> dict[str, float]:
        """Evaluate; ``gen_kwargs`` (``max_length``, ``num_beams``, ...) go to ``model.generate``."""
        self._gen_kwargs = self._generation_defaults(gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
                **gen_kwargs: Any) -> PredictionOutput:
        """Predict; ``gen_kwargs`` (``max_length``, ``num_beams``, ...) go to ``model.generate``."""
        self._gen_kwargs = self._generation_defaults(gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None, **gen_kwargs: Any) -> tuple[Any, Any, Any]:
        """Generate (with ``predict_with_generate``) and return ``(loss, generated_tokens, labels)``.

        As upstream: the loss is the model's forward on the inputs and labels; ``decoder_input_ids`` (and
        ``decoder_attention_mask``) made from the labels are left out of generation; the generated ids and the labels
        are padded to the model's generation-config length (``max_length``, 20 when unset, or ``max_new_tokens + 1``).
        """
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        generator: Any = unwrap_model(model)  # a model with a ``generate`` method (checked below)
        if not hasattr(generator, "generate"):
            raise TypeError(f"predict_with_generate=True needs a model with a `generate` method; "
                            f"{type(generator).__name__} has none (set predict_with_generate=False)")
        gen_kwargs = {**self._gen_kwargs, **gen_kwargs}
        for key in ("num_beams", "max_length"):
            if key in gen_kwargs and gen_kwargs[key] is None:
                gen_kwargs.pop(key)
        if "synced_gpus" not in gen_kwargs and self._generation_needs_synced_gpus():
            gen_kwargs["synced_gpus"] = True
        has_labels = "labels" in inputs
        inputs = self._prepare_inputs(inputs)
        # Upstream's generate calls the prepared model's forward, which accelerate wrapped in autocast and in
        # convert_outputs_to_fp32 (Accelerator.prepare_model under native AMP): the generation steps run in the
        # mixed precision of the loss forward and their logits reach the logits processors as float32.
        with torch.no_grad(), self.backend.autocast(), _float32_outputs(self, generator):
            generated = generator.generate(**_generation_inputs(inputs), **gen_kwargs)
        pad_length = _padded_length(getattr(generator, "generation_config", None), gen_kwargs, generated.shape[-1])
        pad_value = self._pad_token_id()
        if pad_length is not None:
            generated = _pad_to_length(generated, pad_length, pad_value)
        loss = None
        if has_labels:
            with torch.no_grad(), self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs, return_outputs=False).detach().mean()
        if self.args.prediction_loss_only:
            return loss, None, None
        labels = inputs.get("labels") if has_labels else None
        if labels is not None:
            label_length = _padded_length(getattr(generator, "generation_config", None), gen_kwargs,
                                          labels.shape[-1])
            if label_length is not None:
                labels = _pad_to_length(labels, label_length, pad_value)
        return loss, generated, labels

    def _generation_needs_synced_gpus(self) -> bool:
        """Sharded parameters (ZeRO-3, FSDP) on several ranks: every rank must run as many forward passes as the
        longest generation, or the parameter gathers hang (upstream passes ``synced_gpus`` for the same reason)."""
        if self.args.world_size <= 1:
            return False

        return bool(self.args.fsdp) or is_deepspeed_zero3_enabled()

    def _pad_token_id(self) -> int:
        for source in (self.processing_class, getattr(unwrap_model(self.model), "config", None)):
            pad = getattr(source, "pad_token_id", None)
            if isinstance(pad, int):
                return pad
        return PAD_INDEX
