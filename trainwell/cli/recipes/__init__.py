"""Recipes: what ``trainwell train`` trains.

A :class:`Recipe` is default ``TrainingArguments`` values plus a ``build()`` that makes the model and datasets.
:func:`default_recipe` is the built-in character-level language model on Python's standard-library docstrings
(:mod:`trainwell.cli.recipes.charlm`, no download, no extra package); :func:`load_recipe` reads a user's YAML recipe
(:mod:`trainwell.cli.recipes.config`). This package imports torch only when a recipe is built.
"""

from __future__ import annotations

import json
import os
from typing import Any
from pathlib import Path

from .config import Components, Recipe, RecipeError, call_factory, load_object, load_recipe
# The built-in model (torch) loads when the recipe is built: `trainwell train --help` reads this module.

__all__ = ["Components", "Recipe", "RecipeError", "call_factory", "default_recipe", "load_object", "load_recipe",
           "DEFAULT_RECIPE_ARGS"]

#: TrainingArguments of the default recipe (each can be overridden by a command-line flag). Sized so that the
#: whole run takes about a minute of CPU time (docs/performance.md: "How long things take").
DEFAULT_RECIPE_ARGS: dict[str, Any] = {
    "output_dir": "trainwell-output",
    "max_steps": 800,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 64,
    "learning_rate": 3e-3,
    "weight_decay": 0.01,
    "warmup_steps": 50,
    "lr_scheduler_type": "cosine",
    "max_grad_norm": 1.0,
    "eval_strategy": "steps",
    "eval_steps": 200,
    "save_strategy": "steps",
    "save_steps": 400,
    "save_total_limit": 2,
    "logging_steps": 50,
    "report_to": "none",
    "seed": 42,
}

#: Model and data sizes of the default recipe.
DEFAULT_MODEL_KWARGS: dict[str, Any] = {"d_model": 96, "n_layers": 2, "n_heads": 4, "block_size": 64}
SAMPLE_PROMPT = "Return the "
#: How the built-in model is sampled, in the summary and by default in ``trainwell generate`` (so the summary's
#: sample is the beginning of what ``trainwell generate OUTPUT_DIR`` prints for the same prompt).
SAMPLE_TEMPERATURE = 0.8
SAMPLE_SEED = 0
SAMPLE_LENGTH = 80  # characters in the summary (generate's default is longer)
#: The built-in model's config file (next to its weights) and its model type, read by ``trainwell generate``.
MODEL_CONFIG_NAME = "config.json"
MODEL_TYPE = "trainwell-charlm"
#: torch threads of the built-in model (training and `trainwell generate`) unless OMP_NUM_THREADS is set: a
#: model this small gains little from a second thread and, on a busy machine, loses many times its speed to threads
#: spinning for a core they do not get.
BUILTIN_THREADS = 1


def _build_default() -> Components:
    """The char-level model, its datasets and vocabulary (``extras["vocab"]``)."""
    from . import charlm

    train, evaluation, vocab = charlm.build_datasets(block_size=DEFAULT_MODEL_KWARGS["block_size"])
    model = charlm.build_model(vocab_size=vocab.size, **DEFAULT_MODEL_KWARGS)
    return Components(model=model, train_dataset=train, eval_dataset=evaluation, extras={"vocab": vocab})


def _finish_default(components: Components, trainer: Any) -> list[tuple[str, str]]:
    """Save the vocabulary and model config next to the model and show a sampled continuation of a prompt."""
    from . import charlm

    vocab = components.extras["vocab"]
    if trainer.is_world_process_zero():
        vocab.save_pretrained(trainer.args.output_dir)
        config = {"model_type": MODEL_TYPE, **components.model.config}
        (Path(trainer.args.output_dir) / MODEL_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
    return [(sample_label(), SAMPLE_PROMPT + summary_sample(trainer.model, vocab) + "\n")]


def summary_sample(model: Any, vocab: Any) -> str:
    """The summary's continuation of :data:`SAMPLE_PROMPT`: ``trainwell generate``'s decoding (temperature, seed),
    :data:`SAMPLE_LENGTH` characters."""
    from . import charlm

    return charlm.generate(model, vocab, SAMPLE_PROMPT, n=SAMPLE_LENGTH, temperature=SAMPLE_TEMPERATURE,
                           seed=SAMPLE_SEED)


def sample_label() -> str:
    """The summary's label of the sample: the prompt and the decoding, which ``trainwell generate`` uses too."""
    return f"sample (after {SAMPLE_PROMPT!r}, temperature {SAMPLE_TEMPERATURE}, seed {SAMPLE_SEED})"


#: Environment variable that lowers (or raises) the built-in recipe's default ``max_steps`` without a flag, so the
#: README's commands can run as written in a quick check; ``--max_steps`` still wins over it.
MAX_STEPS_ENV = "TRAINWELL_RECIPE_MAX_STEPS"


def default_recipe() -> Recipe:
    """The built-in recipe: a 2-layer character transformer on the standard library's docstrings."""
    args = dict(DEFAULT_RECIPE_ARGS)
    wanted = os.environ.get(MAX_STEPS_ENV, "").strip()
    if wanted:
        if not wanted.isdigit() or int(wanted) < 1:
            raise RecipeError(f"{MAX_STEPS_ENV}={wanted!r}: expected a positive whole number of steps, "
                              f"or unset it to train the recipe's {DEFAULT_RECIPE_ARGS['max_steps']} steps")
        args["max_steps"] = int(wanted)
    return Recipe(name="built-in: char-level transformer on Python stdlib docstrings",
                  args=args, build=_build_default, finish=_finish_default,
                  language_model=True, num_threads=BUILTIN_THREADS)
