"""The example-script cases (script, data, arguments) in both eras, and what a run leaves that the tests compare.

Shared by the tests and by ``record_v4_goldens.py`` (which runs in a venv with transformers 4.47), so both run the
very same command lines. A case's arguments are a list of strings with ``{world}`` (the folder built by
:mod:`examples_world`) and ``{out}`` (the run's output folder) left to fill.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
GOLDENS = HERE / "goldens_v4"

_TRAIN = ["--do_train", "--do_eval", "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "4",
          "--learning_rate", "1e-3", "--num_train_epochs", "2", "--logging_steps", "2", "--eval_steps", "6",
          "--save_steps", "6", "--seed", "7", "--report_to", "none", "--disable_tqdm", "true"]
# 5.x spells the eval schedule eval_strategy; the v4 copy uses the seeds' API (evaluation_strategy, warmup_ratio,
# overwrite_output_dir), which the installed transformers 5.x no longer accepts.
ERA_ARGS = {"5x": ["--eval_strategy", "steps"],
            "v4": ["--evaluation_strategy", "steps", "--overwrite_output_dir", "--warmup_ratio", "0.1"]}


def _files(stem: str, test: bool = True, suffix: str = "json") -> list[str]:
    out = ["--train_file", f"{{world}}/{stem}_train.{suffix}", "--validation_file",
           f"{{world}}/{stem}_validation.{suffix}"]
    return out + (["--test_file", f"{{world}}/{stem}_test.{suffix}", "--do_predict"] if test else [])


# name -> (script, model folder, arguments)
CASES: dict[str, tuple[str, str, list[str]]] = {
    "glue": ("run_glue.py", "model_glue", _files("glue")),
    "clm": ("run_clm.py", "model_clm", _files("lm", test=False, suffix="txt") + ["--max_seq_length", "16"]),
    "mlm": ("run_mlm.py", "model_mlm", _files("lm", test=False, suffix="txt") + ["--max_seq_length", "16"]),
    "ner": ("run_ner.py", "model_ner", _files("ner")),
    "qa": ("run_qa.py", "model_qa", _files("qa") + ["--max_seq_length", "24", "--doc_stride", "8"]),
    "summarization": ("run_summarization.py", "model_summarization",
                      _files("summ") + ["--predict_with_generate", "--num_beams", "2", "--max_target_length", "6"]),
    "swag": ("run_swag.py", "model_swag", _files("swag", test=False)),
}
# Gradient accumulation (2 micro-batches of 4), where 4.47 logs the sum of the micro-batch means.
ACCUMULATION = ("glue", ["--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "2"])


def command(case: str, era: str, world: Path, out: Path, extra: list[str] = ()) -> list[str]:
    """The script path and its arguments for ``case`` in ``era``, writing into ``out``."""
    script, model, args = CASES[case]
    filled = [a.format(world=world, out=out) for a in args]
    return [str(SCRIPTS / script), "--model_name_or_path", str(world / model), "--output_dir", str(out),
            *_TRAIN, *ERA_ARGS[era], *filled, *extra]


# Keys whose values measure time or the machine, not the run.
def is_timing(key: str) -> bool:
    """True for runtime / throughput keys (and the FLOP estimate, which the releases compute differently)."""
    return key.endswith(("_runtime", "_per_second")) or key in ("total_flos",)


PREDICTION_FILES = ("predict_results.txt", "predictions.txt", "eval_predictions.json", "predict_predictions.json",
                    "generated_predictions.txt")


def collect(out: Path, model_class: str | None = None) -> dict[str, Any]:
    """What a finished run left in ``out``: the metrics files (timings dropped), the log history, the files and
    checkpoint folders it wrote, the prediction files' text and, with ``model_class``, the saved model's weights
    summarised per tensor (sum and sum of squares), as loaded by ``from_pretrained``."""
    state = json.loads((out / "trainer_state.json").read_text()) if (out / "trainer_state.json").is_file() else {}
    result: dict[str, Any] = {
        "log_history": [{k: v for k, v in entry.items() if not is_timing(k)} for entry in state.get("log_history", [])],
        "global_step": state.get("global_step"),
        "files": sorted(p.name for p in out.iterdir() if p.is_file()),
        "checkpoints": sorted(p.name for p in out.iterdir() if p.is_dir() and p.name.startswith("checkpoint-")),
        "predictions": {name: (out / name).read_text() for name in PREDICTION_FILES if (out / name).is_file()},
    }
    for name in ("all_results.json", "train_results.json", "eval_results.json", "predict_results.json"):
        if (out / name).is_file():
            result[name] = {k: v for k, v in json.loads((out / name).read_text()).items() if not is_timing(k)}
    if model_class is not None:
        result["weights"] = weight_summary(out, model_class)
    return result


def weight_summary(folder: Path, model_class: str) -> dict[str, list[float]]:
    """{name: [sum, sum of squares]} of the model saved in ``folder``, loaded with ``model_class.from_pretrained``."""
    import transformers

    model = getattr(transformers, model_class).from_pretrained(str(folder))
    return {name: [float(t.double().sum()), float((t.double() ** 2).sum())]
            for name, t in sorted(model.state_dict().items())}


MODEL_CLASSES = {"glue": "BertForSequenceClassification", "clm": "GPT2LMHeadModel", "mlm": "BertForMaskedLM",
                 "ner": "BertForTokenClassification", "qa": "BertForQuestionAnswering",
                 "summarization": "T5ForConditionalGeneration", "swag": "BertForMultipleChoice"}


def close(a: Any, b: Any, *, rel: float = 1e-5, abs_: float = 1e-7, path: str = "") -> list[str]:
    """The places (paths) where ``a`` and ``b`` differ: numbers beyond the tolerance, anything else unequal."""
    if isinstance(a, dict) and isinstance(b, dict):
        diffs = [f"{path}/{k}: only in {'first' if k in a else 'second'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            diffs += close(a[k], b[k], rel=rel, abs_=abs_, path=f"{path}/{k}")
        return diffs
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in close(x, y, rel=rel, abs_=abs_, path=f"{path}[{i}]")]
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        same = math.isclose(a, b, rel_tol=rel, abs_tol=abs_) or (math.isnan(a) and math.isnan(b))
        return [] if same else [f"{path}: {a!r} vs {b!r}"]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]
