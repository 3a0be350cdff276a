"""A small Keras digits classifier that follows the TFTrainer contract, and the digits data as tf.data."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

keras = tf.keras


class DigitsClassifier(keras.Model):
    """Two dense layers; called with labels it returns (per-example loss, logits), as transformers TF models did."""

    def __init__(self, hidden: int = 16, n_classes: int = 10, seed: int = 0, mean_loss: bool = False) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(hidden, activation="tanh",
                                         kernel_initializer=keras.initializers.GlorotUniform(seed=seed))
        self.head = keras.layers.Dense(n_classes, kernel_initializer=keras.initializers.GlorotUniform(seed=seed + 1))
        self.mean_loss = mean_loss

    def call(self, features, labels=None, training=False):
        logits = self.head(self.hidden(features["pixels"]))
        if labels is None:
            return logits
        loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return (tf.reduce_mean(loss) if self.mean_loss else loss), logits


def digits(n_train: int = 64, n_eval: int = 40):
    """((x_train, y_train), (x_eval, y_eval)) from scikit-learn's digits, scaled to [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.data / 16.0).astype("float32")
    y = data.target.astype("int64")
    return (x[:n_train], y[:n_train]), (x[n_train:n_train + n_eval], y[n_train:n_train + n_eval])


def as_dataset(x: np.ndarray, y: np.ndarray | None = None) -> tf.data.Dataset:
    if y is None:
        return tf.data.Dataset.from_tensor_slices({"pixels": x})
    return tf.data.Dataset.from_tensor_slices(({"pixels": x}, y))
