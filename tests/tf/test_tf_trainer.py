"""TFTrainer (seed 002) on a Keras digits classifier: training, accumulation, checkpoints, evaluation, TensorBoard."""

from __future__ import annotations

import logging
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("sklearn")

from tf_digits import DigitsClassifier, as_dataset, digits  # noqa: E402

from trainwell.tf import TFTrainer, TFTrainingArguments  # noqa: E402

pytestmark = pytest.mark.slow  # TensorFlow's import and graph building: over a second a test

keras = tf.keras
REPO = Path(__file__).resolve().parents[2]


def _args(tmp_path: Path, **kw) -> TFTrainingArguments:
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, per_device_eval_batch_size=8,
                learning_rate=1e-2, max_steps=8, logging_steps=1, save_strategy="no", report_to="none")
    base.update(kw)
    return TFTrainingArguments(**base)


def _accuracy(pred) -> dict[str, float]:
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def _weights(model) -> list[np.ndarray]:
    return [v.numpy() for v in model.trainable_variables]


def _hand_loop(x, y, steps: int, batch: int, lr: float, seed: int = 42, max_grad_norm: float = 1.0):
    """The same training written by hand: tf.data shuffle/repeat/batch, Adam + linear decay, clip, GradientTape."""
    tf.random.set_seed(seed)
    model = DigitsClassifier()
    optimizer = keras.optimizers.Adam(keras.optimizers.schedules.PolynomialDecay(lr, steps, 0.0, power=1.0),
                                      beta_1=0.9, beta_2=0.999, epsilon=1e-8)
    ds = (tf.data.Dataset.from_tensor_slices(({"pixels": x}, y))
          .shuffle(len(x), seed=seed, reshuffle_each_iteration=True).repeat().batch(batch, drop_remainder=True))
    for features, labels in ds.take(steps):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(features, labels=labels, training=True)[0])
        grads = tape.gradient(loss, model.trainable_variables)
        grads, _ = tf.clip_by_global_norm(grads, max_grad_norm)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return model


def _eval_loss(model, x, y) -> float:
    loss, _ = model({"pixels": x}, labels=y, training=False)
    return float(tf.reduce_mean(loss).numpy())


def test_trains_and_matches_a_hand_written_gradient_tape_loop(tmp_path):
    (xt, yt), (xe, ye) = digits()
    trainer = TFTrainer(DigitsClassifier(), _args(tmp_path, max_steps=16), as_dataset(xt, yt), as_dataset(xe, ye),
                        compute_metrics=_accuracy)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()
    assert after["eval_loss"] < before - 0.1
    reference = _hand_loop(xt, yt, steps=16, batch=8, lr=1e-2)
    assert after["eval_loss"] == pytest.approx(_eval_loss(reference, xe, ye), rel=1e-5)
    for mine, theirs in zip(_weights(trainer.model), _weights(reference)):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-6)
    assert trainer.global_step == 16
    losses = [h["loss"] for h in trainer.log_history if "loss" in h]
    assert len(losses) == 16 and np.mean(losses[-4:]) < np.mean(losses[:4])
    assert "eval_accuracy" in after and trainer.log_history[-1] == {**after, "epoch": 2.0, "step": 16}


def test_gradient_accumulation_2x4_equals_batch_8(tmp_path):
    (xt, yt), _ = digits()
    big = TFTrainer(DigitsClassifier(), _args(tmp_path / "a", max_steps=6), as_dataset(xt, yt))
    big.train()
    acc = TFTrainer(DigitsClassifier(), _args(tmp_path / "b", max_steps=6, per_device_train_batch_size=4,
                                              gradient_accumulation_steps=2), as_dataset(xt, yt))
    acc.train()
    assert acc.global_step == big.global_step == 6
    for a, b in zip(_weights(acc.model), _weights(big.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    la = [h["loss"] for h in acc.log_history]
    lb = [h["loss"] for h in big.log_history]
    np.testing.assert_allclose(la, lb, rtol=1e-5)


def test_a_mean_loss_model_trains_like_a_per_example_loss_model(tmp_path):
    (xt, yt), (xe, ye) = digits(n_eval=37)
    runs = []
    for mean_loss in (False, True):
        tr = TFTrainer(DigitsClassifier(mean_loss=mean_loss), _args(tmp_path / str(mean_loss), max_steps=4,
                       per_device_train_batch_size=4, gradient_accumulation_steps=2), as_dataset(xt, yt))
        tr.train()
        runs.append((_weights(tr.model), tr.evaluate(as_dataset(xe, ye))["eval_loss"]))
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert runs[0][1] == pytest.approx(runs[1][1], rel=1e-6)


class _Interrupt(Exception):
    pass


class _StopsAfter(TFTrainer):
    stop_at = 5

    def log(self, logs):
        if self.global_step >= self.stop_at:
            raise _Interrupt
        super().log(logs)


def test_checkpoint_and_resume_continue_the_same_curve(tmp_path):
    (xt, yt), _ = digits()
    kw = dict(max_steps=8, save_strategy="steps", save_steps=2, save_total_limit=2, warmup_steps=2)
    full = TFTrainer(DigitsClassifier(), _args(tmp_path / "full", **kw), as_dataset(xt, yt))
    full.train()
    folder = tmp_path / "full" / "out" / "checkpoint"
    assert sorted(p.name for p in folder.glob("*.index")) == ["ckpt-6.index", "ckpt-8.index"]  # rotation

    out = tmp_path / "cut"
    cut = _StopsAfter(DigitsClassifier(), _args(out, **kw), as_dataset(xt, yt))
    with pytest.raises(_Interrupt):
        cut.train()  # step 5 ran; the last checkpoint is step 4
    resumed = TFTrainer(DigitsClassifier(seed=7), _args(out, **kw), as_dataset(xt, yt))
    resumed.train()
    assert [h["step"] for h in resumed.log_history] == [5, 6, 7, 8]
    np.testing.assert_allclose([h["loss"] for h in resumed.log_history],
                               [h["loss"] for h in full.log_history[4:]], rtol=1e-5)
    np.testing.assert_allclose([h["learning_rate"] for h in resumed.log_history],
                               [h["learning_rate"] for h in full.log_history[4:]], rtol=1e-6)
    for a, b in zip(_weights(resumed.model), _weights(full.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_predictions_and_metrics_through_eval_prediction_with_a_short_last_batch(tmp_path):
    (xt, yt), (xe, ye) = digits(n_eval=37)
    seen = []

    def metrics(pred):
        seen.append(pred)
        return _accuracy(pred)

    trainer = TFTrainer(DigitsClassifier(), _args(tmp_path), as_dataset(xt, yt), as_dataset(xe, ye),
                        compute_metrics=metrics)
    out = trainer.predict(as_dataset(xe, ye))
    assert out.predictions.shape == (37, 10)
    np.testing.assert_array_equal(out.label_ids, ye)
    np.testing.assert_array_equal(seen[-1].label_ids, ye)
    logits = trainer.model({"pixels": xe}).numpy()
    np.testing.assert_allclose(out.predictions, logits, rtol=1e-5, atol=1e-6)
    assert out.metrics["eval_accuracy"] == pytest.approx(float((logits.argmax(-1) == ye).mean()))
    assert out.metrics["eval_loss"] == pytest.approx(_eval_loss(trainer.model, xe, ye), rel=1e-6)

    no_labels = trainer.predict(as_dataset(xe))
    np.testing.assert_allclose(no_labels.predictions, logits, rtol=1e-5, atol=1e-6)
    assert no_labels.label_ids is None and no_labels.metrics == {}

    loss_only = TFTrainer(DigitsClassifier(), _args(tmp_path, prediction_loss_only=True),
                          eval_dataset=as_dataset(xe, ye))
    metrics_only = loss_only.evaluate()
    assert set(metrics_only) == {"eval_loss"}


def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (xt, yt), (xe, ye) = digits()
    args = _args(tmp_path, max_steps=4, logging_steps=0.5, eval_strategy="steps", eval_steps=4)  # 0.5: half the run
    trainer = TFTrainer(DigitsClassifier(), args, as_dataset(xt, yt), as_dataset(xe, ye))
    trainer.train()
    acc = EventAccumulator(args.logging_dir, size_guidance={"tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["tensors"])
    assert {"loss", "learning_rate", "eval_loss", "epoch"} <= tags
    loss = [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in acc.Tensors("loss")]
    assert [s for s, _ in loss] == [2, 4]
    np.testing.assert_allclose([v for _, v in loss], [h["loss"] for h in trainer.log_history if "loss" in h],
                               rtol=1e-6)
    eval_loss = [float(tf.make_ndarray(e.tensor_proto)) for e in acc.Tensors("eval_loss")]
    assert eval_loss == pytest.approx([trainer.log_history[-1]["eval_loss"]])

    writer = tf.summary.create_file_writer(str(tmp_path / "mine"))
    TFTrainer(DigitsClassifier(), args, eval_dataset=as_dataset(xe, ye), tb_writer=writer).evaluate()
    mine = EventAccumulator(str(tmp_path / "mine"))
    mine.Reload()
    assert "eval_loss" in mine.Tags()["tensors"]


def test_xla_steps_train_like_graph_steps(tmp_path):
    (xt, yt), _ = digits()
    runs = []
    for xla in (False, True):
        tr = TFTrainer(DigitsClassifier(), _args(tmp_path / str(xla), max_steps=3, xla=xla), as_dataset(xt, yt))
        tr.train()
        runs.append(_weights(tr.model))
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bad_input_fails_early_and_clearly(tmp_path):
    (xt, yt), _ = digits()
    with pytest.raises(TypeError, match="TFTrainingArguments"):
        from trainwell import TrainingArguments

        TFTrainer(DigitsClassifier(), TrainingArguments(output_dir=str(tmp_path), report_to="none"))
    with pytest.raises(ValueError, match="requires a train_dataset"):
        TFTrainer(DigitsClassifier(), _args(tmp_path)).train()
    with pytest.raises(ValueError, match="requires an eval_dataset"):
        TFTrainer(DigitsClassifier(), _args(tmp_path)).evaluate()
    infinite = as_dataset(xt, yt).repeat()
    with pytest.raises(ValueError, match="cardinality"):
        TFTrainer(DigitsClassifier(), _args(tmp_path), infinite).train()
    class NoLoss(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(10)

        def call(self, features, labels=None, training=False):
            return self.dense(features["pixels"])

    with pytest.raises(ValueError, match="returned no loss"):
        TFTrainer(NoLoss(), _args(tmp_path), as_dataset(xt, yt)).train()


def test_save_model_writes_keras_weights_that_load_back(tmp_path):
    (xt, yt), (xe, _) = digits()
    trainer = TFTrainer(DigitsClassifier(), _args(tmp_path, max_steps=2), as_dataset(xt, yt))
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    fresh = DigitsClassifier(seed=3)
    fresh({"pixels": xe[:1]})
    fresh.load_weights(str(tmp_path / "saved" / "tf_model.weights.h5"))
    np.testing.assert_allclose(fresh({"pixels": xe}).numpy(), trainer.model({"pixels": xe}).numpy(), rtol=1e-6)


def test_the_seed_script_runs_with_the_import_changed(tmp_path, monkeypatch, capsys):
    script = REPO / "examples" / "tf_trainer_seed_script.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--output_dir", str(tmp_path / "seed"), "--do_train", "--do_eval",
                                      "--max_steps", "6", "--learning_rate", "0.01", "--logging_steps", "3",
                                      "--save_steps", "3", "--per_device_train_batch_size", "8"])
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:  # the script's logging.basicConfig must not leak into later tests
        root.handlers[:], root.level = handlers, level
    out = capsys.readouterr().out
    assert "eval_loss" in out and "eval_accuracy" in out
    assert (tmp_path / "seed" / "checkpoint" / "ckpt-6.index").exists()
    assert (tmp_path / "seed" / "tf_model.weights.h5").exists()


def test_bf16_trains_with_keras_mixed_bfloat16_on_the_cpu(tmp_path):
    (xt, yt), (xe, ye) = digits()
    args = _args(tmp_path, bf16=True, max_steps=8)
    try:
        with args.strategy.scope():
            model = DigitsClassifier()
        assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
        trainer = TFTrainer(model, args, as_dataset(xt, yt), as_dataset(xe, ye))
        before = trainer.evaluate()["eval_loss"]
        trainer.train()
        after = trainer.evaluate()["eval_loss"]
        assert model.head.compute_dtype == "bfloat16" and model.head.kernel.dtype == "float32"
        assert np.isfinite(after) and after < before
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_epoch_strategies_and_resume_from_a_named_checkpoint(tmp_path):
    (xt, yt), (xe, ye) = digits()  # 64 examples, batch 16: 4 steps per epoch
    kw = dict(num_train_epochs=2, max_steps=-1, per_device_train_batch_size=16, logging_strategy="epoch",
              eval_strategy="epoch", save_strategy="epoch")
    full = TFTrainer(DigitsClassifier(), _args(tmp_path / "a", **kw), as_dataset(xt, yt), as_dataset(xe, ye))
    full.train()
    assert [(h["step"], h["epoch"], "loss" in h, "eval_loss" in h) for h in full.log_history] == [
        (4, 1.0, True, False), (4, 1.0, False, True), (8, 2.0, True, False), (8, 2.0, False, True)]
    folder = tmp_path / "a" / "out" / "checkpoint"
    assert sorted(p.name for p in folder.glob("*.index")) == ["ckpt-4.index", "ckpt-8.index"]

    resumed = TFTrainer(DigitsClassifier(seed=5), _args(tmp_path / "b", resume_from_checkpoint=str(folder / "ckpt-4"),
                                                         **kw), as_dataset(xt, yt), as_dataset(xe, ye))
    resumed.train()
    assert [h["step"] for h in resumed.log_history] == [8, 8]
    assert resumed.log_history[-1]["eval_loss"] == pytest.approx(full.log_history[-1]["eval_loss"], rel=1e-5)
    for a, b in zip(_weights(resumed.model), _weights(full.model)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="holds no tf.train checkpoint"):
        TFTrainer(DigitsClassifier(), _args(tmp_path / "c", resume_from_checkpoint=str(tmp_path), **kw),
                  as_dataset(xt, yt)).train()


def test_a_loss_scale_optimizer_trains_like_the_plain_one(tmp_path):
    """The fp16 path (scaled loss, clipping on the unscaled norm) on the CPU, with a user-given LossScaleOptimizer."""
    (xt, yt), _ = digits()
    runs = []
    for scaled in (False, True):
        args = _args(tmp_path / str(scaled), max_steps=4, max_grad_norm=0.1)
        schedule = keras.optimizers.schedules.PolynomialDecay(1e-2, 4, 0.0)
        with args.strategy.scope():  # as upstream: optimizers passed in are created under the strategy
            opt = keras.optimizers.Adam(schedule)
            if scaled:
                opt = keras.optimizers.LossScaleOptimizer(opt, initial_scale=2.0**10)
        tr = TFTrainer(DigitsClassifier(), args, as_dataset(xt, yt), optimizers=(opt, schedule))
        tr.train()
        runs.append(_weights(tr.model))
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
