"""``Seq2SeqTrainingArguments``: ``TrainingArguments`` plus the generation options of ``Seq2SeqTrainer``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from .fields import TrainingArguments, _f, suggest_unknown_arguments


@suggest_unknown_arguments
@dataclass(repr=False)
class Seq2SeqTrainingArguments(TrainingArguments):
    """Training arguments for sequence-to-sequence models (upstream names and defaults).

    ``generation_config`` may be a folder or file path (kept as a string, loaded by the trainer), a dict, or a
    ``GenerationConfig``-like object; ``to_dict`` turns an object into a dict through its ``to_dict()``.
    """

    sortish_sampler: bool = _f(False, "Sample batches of roughly sorted lengths (less padding).")
    predict_with_generate: bool = _f(False, "Use generate() to compute generative metrics (ROUGE, BLEU).")
    generation_max_length: int | None = _f(None, "max_length for generate() during evaluation (default: the "
                                           "model's generation config).")
    generation_num_beams: int | None = _f(None, "num_beams for generate() during evaluation (default: the "
                                          "model's generation config).")
    generation_config: dict | str | None = _f(None, "Generation config: a path, a dict or a GenerationConfig.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.generation_max_length is not None and self.generation_max_length < 1:
            raise ValueError(f"generation_max_length={self.generation_max_length} must be a positive number of "
                             "tokens, or None to use the model's generation config.")
        if self.generation_num_beams is not None and self.generation_num_beams < 1:
            raise ValueError(f"generation_num_beams={self.generation_num_beams} must be >= 1 (1 is greedy), or "
                             "None to use the model's generation config.")
        if isinstance(self.generation_config, os.PathLike):
            self.generation_config = os.fspath(self.generation_config)

