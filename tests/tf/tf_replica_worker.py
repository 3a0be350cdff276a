"""Child process of test_tf_replicas.py: split the CPU into 2 logical devices (before TensorFlow initialises),
train and evaluate with TFTrainer on the 2 replicas, and save what the parent compares."""

from __future__ import annotations

import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from tf_digits import DigitsClassifier, as_dataset, digits  # noqa: E402

from trainwell.tf import TFTrainer, TFTrainingArguments  # noqa: E402


def main(out_dir: str, scenarios: str) -> None:
    (xt, yt), (xe, ye) = digits(n_eval=33)
    results = {}
    for name, kw in json.loads(scenarios).items():
        args = TFTrainingArguments(output_dir=f"{out_dir}/{name}", report_to="none", save_strategy="no",
                                   logging_steps=1, **kw)
        assert args.n_replicas == 2, args.strategy
        trainer = TFTrainer(DigitsClassifier(), args, as_dataset(xt, yt), as_dataset(xe, ye),
                            compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids)
                                                                         .mean())})
        trainer.train()
        pred = trainer.predict(as_dataset(xe, ye))
        np.savez(f"{out_dir}/{name}.npz", *[v.numpy() for v in trainer.model.trainable_variables],
                 predictions=pred.predictions, label_ids=pred.label_ids)
        results[name] = {"strategy": type(args.strategy).__name__, "train_batch_size": args.train_batch_size,
                         "losses": [h["loss"] for h in trainer.log_history if "loss" in h],
                         "metrics": {k: float(v) for k, v in pred.metrics.items()}}
    with open(f"{out_dir}/results.json", "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
