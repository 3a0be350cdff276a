"""``trainwell generate OUTPUT_DIR "prompt"``: sample text from a model saved by the built-in recipe.

``trainwell train`` saves, next to the weights, ``config.json`` (the model's sizes, ``"model_type":
"trainwell-charlm"``) and ``vocab.json``; this command rebuilds the model from them and continues the prompt.
A ``checkpoint-<step>`` folder works too (the config and vocabulary are then read from its parent).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from ..arguments import CLIError, RaisingArgumentParser, positive_int

from ..recipes import MODEL_CONFIG_NAME as CONFIG_NAME
from ..recipes import MODEL_TYPE, SAMPLE_PROMPT, SAMPLE_SEED, SAMPLE_TEMPERATURE
# torch and the model load when the command runs: `trainwell generate --help` starts without them.


def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder.parent / name):
        if candidate.is_file():
            return candidate
    return None


def load_charlm(folder: str | Path):  # -> (CharTransformerLM, CharVocab)
    """The built-in recipe's model and vocabulary saved in ``folder``."""
    from ...checkpoint.weights import load_state_dict_from_folder
    from ..recipes import charlm

    folder = Path(folder)
    if not folder.is_dir():
        raise CLIError(f"{folder}: no such folder; pass the output_dir of a 'trainwell train' run")
    config_file, vocab_file = _find(folder, CONFIG_NAME), _find(folder, "vocab.json")
    if config_file is None or vocab_file is None:
        raise CLIError(f"{folder}: no {CONFIG_NAME} and vocab.json of the built-in model; 'trainwell generate' "
                       "samples from the output_dir of a finished 'trainwell train' run (built-in recipe)")
    config = json.loads(config_file.read_text())
    if config.get("model_type") != MODEL_TYPE:
        raise CLIError(f"{config_file}: model_type {config.get('model_type')!r} is not the built-in recipe's "
                       f"{MODEL_TYPE!r}; load other models in Python")
    kwargs = {k: config[k] for k in ("vocab_size", "d_model", "n_layers", "n_heads", "block_size", "dropout")}
    model = charlm.build_model(**kwargs)
    try:
        state = load_state_dict_from_folder(folder)
    except Exception as exc:
        raise CLIError(f"{folder}: cannot read the model weights ({' '.join(str(exc).split())})") from None
    model.load_state_dict(state)
    model.eval()
    return model, charlm.CharVocab.from_pretrained(vocab_file.parent)


def use_builtin_threads(environ: Mapping[str, str] | None = None) -> bool:
    """Sample on the built-in recipe's thread count, as its training does, unless ``OMP_NUM_THREADS`` chooses;
    returns whether the count was set."""
    from ..recipes import BUILTIN_THREADS

    if (os.environ if environ is None else environ).get("OMP_NUM_THREADS"):
        return False
    import torch

    torch.set_num_threads(BUILTIN_THREADS)
    return True


def run(argv: list[str]) -> int:
    """``trainwell generate OUTPUT_DIR PROMPT [--length N --temperature T --seed S]``."""
    parser = RaisingArgumentParser(prog="trainwell generate",
                                   description="Continue a prompt with the model of a built-in-recipe run.")
    parser.add_argument("output_dir", help="the output_dir of a 'trainwell train' run (or one of its checkpoints)")
    parser.add_argument("prompt", nargs="?", default=SAMPLE_PROMPT,
                        help=f"the text to continue (default {SAMPLE_PROMPT!r}, the training summary's)")
    parser.add_argument("--length", type=positive_int, default=200, help="characters to generate (default 200)")
    parser.add_argument("--temperature", type=float, default=SAMPLE_TEMPERATURE,
                        help=f"sampling temperature (default {SAMPLE_TEMPERATURE}, as the training summary's sample)")
    parser.add_argument("--seed", type=int, default=SAMPLE_SEED,
                        help=f"sampling seed (default {SAMPLE_SEED}, as the training summary's sample)")
    ns = parser.parse_args(argv)
    if not ns.temperature > 0:
        raise CLIError(f"--temperature must be > 0, got {ns.temperature}")
    from ..recipes import charlm

    use_builtin_threads()
    model, vocab = load_charlm(ns.output_dir)
    text = charlm.generate(model, vocab, ns.prompt, n=ns.length, temperature=ns.temperature, seed=ns.seed)
    print(ns.prompt + text)
    return 0
