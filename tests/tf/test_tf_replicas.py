"""Multi-replica TFTrainer on the CPU: 2 logical devices (MirroredStrategy) must train like 1 device.

The logical devices must be configured before TensorFlow initialises, so the 2-replica run is a subprocess
(tf_replica_worker.py); the 1-replica reference runs here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

from tf_digits import DigitsClassifier, as_dataset, digits  # noqa: E402

from trainwell.tf import TFTrainer, TFTrainingArguments  # noqa: E402

HERE = Path(__file__).resolve().parent
COMMON = dict(max_steps=6, learning_rate=1e-2, max_grad_norm=0.1, per_device_eval_batch_size=4)  # clipping on
SCENARIOS = {
    "replicas_2x4": dict(per_device_train_batch_size=4, **COMMON),
    "replicas_2x2_accumulate_2": dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, **COMMON),
}


@pytest.mark.slow
def test_two_replicas_of_4_match_one_replica_of_8(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)]),
           "OMP_NUM_THREADS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([sys.executable, str(HERE / "tf_replica_worker.py"), str(tmp_path), json.dumps(SCENARIOS)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())

    (xt, yt), (xe, ye) = digits(n_eval=33)  # eval: 4 global batches of 8 and one of 1 (one replica gets nothing)
    args = TFTrainingArguments(output_dir=str(tmp_path / "one"), report_to="none", save_strategy="no", logging_steps=1,
                               **{**COMMON, "per_device_train_batch_size": 8, "per_device_eval_batch_size": 8})
    assert args.n_replicas == 1
    ref = TFTrainer(DigitsClassifier(), args, as_dataset(xt, yt), as_dataset(xe, ye),
                    compute_metrics=lambda p: {"accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
    ref.train()
    pred = ref.predict(as_dataset(xe, ye))
    ref_weights = [v.numpy() for v in ref.model.trainable_variables]
    ref_losses = [h["loss"] for h in ref.log_history if "loss" in h]

    for name in SCENARIOS:
        got = results[name]
        assert got["strategy"] == "MirroredStrategy" and got["train_batch_size"] == SCENARIOS[name][
            "per_device_train_batch_size"] * 2
        np.testing.assert_allclose(got["losses"], ref_losses, rtol=1e-5)
        saved = np.load(tmp_path / f"{name}.npz")
        for i, w in enumerate(ref_weights):
            np.testing.assert_allclose(saved[f"arr_{i}"], w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(saved["label_ids"], ye)
        np.testing.assert_allclose(saved["predictions"], pred.predictions, rtol=1e-5, atol=1e-6)
        for key, value in pred.metrics.items():
            assert got["metrics"][key] == pytest.approx(float(value), rel=1e-6), key
