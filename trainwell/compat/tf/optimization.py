"""The default optimizer and learning-rate schedule of the TensorFlow trainer (upstream ``optimization_tf``).

``create_optimizer`` returns Adam (or AdamW with decoupled weight decay that skips biases and layer norms) driven
by a ``PolynomialDecay`` of power ``poly_power`` to 0 after an optional linear ``WarmUp``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

if TYPE_CHECKING:
    from tensorflow import keras  # the module the alias below names, for annotations
else:
    keras = tf.keras


@keras.utils.register_keras_serializable(package="trainwell")
class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    """Warm up from 0 to ``initial_learning_rate`` over ``warmup_steps`` (``(step/warmup)**power``), then
    follow ``decay_schedule_fn(step - warmup_steps)``."""

    def __init__(self, initial_learning_rate: float, decay_schedule_fn: Callable[[Any], Any], warmup_steps: int,
                 power: float = 1.0, name: str | None = None) -> None:
        super().__init__()
        self.initial_learning_rate = initial_learning_rate
        self.warmup_steps = warmup_steps
        self.power = power
        self.decay_schedule_fn = decay_schedule_fn
        self.name = name

    def __call__(self, step: Any) -> tf.Tensor:
        with tf.name_scope(self.name or "WarmUp"):
            step_float = tf.cast(step, tf.float32)
            warmup_float = tf.cast(self.warmup_steps, tf.float32)
            warmup_lr = self.initial_learning_rate * tf.math.pow(step_float / warmup_float, self.power)
            return tf.cond(step_float < warmup_float, lambda: warmup_lr,
                           lambda: tf.cast(self.decay_schedule_fn(step - self.warmup_steps), tf.float32))

    def get_config(self) -> dict[str, Any]:
        return {"initial_learning_rate": self.initial_learning_rate, "decay_schedule_fn": self.decay_schedule_fn,
                "warmup_steps": self.warmup_steps, "power": self.power, "name": self.name}


def create_optimizer(init_lr: float, num_train_steps: int, num_warmup_steps: int, min_lr_ratio: float = 0.0,
                     adam_beta1: float = 0.9, adam_beta2: float = 0.999, adam_epsilon: float = 1e-8,
                     weight_decay_rate: float = 0.0, power: float = 1.0,
                     ) -> tuple[keras.optimizers.Optimizer, keras.optimizers.schedules.LearningRateSchedule]:
    """(optimizer, schedule) as upstream's ``create_optimizer``: polynomial decay of ``power`` from ``init_lr``
    to ``init_lr * min_lr_ratio`` over the steps after the warmup; Adam, or AdamW when ``weight_decay_rate > 0``
    (no decay on ``bias``/``LayerNorm``/``layer_norm`` variables)."""
    schedule: keras.optimizers.schedules.LearningRateSchedule = keras.optimizers.schedules.PolynomialDecay(
        initial_learning_rate=init_lr, decay_steps=max(1, num_train_steps - num_warmup_steps),
        end_learning_rate=init_lr * min_lr_ratio, power=power)
    if num_warmup_steps:
        schedule = WarmUp(initial_learning_rate=init_lr, decay_schedule_fn=schedule, warmup_steps=num_warmup_steps)
    if weight_decay_rate > 0.0:
        optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=weight_decay_rate, beta_1=adam_beta1,
                                           beta_2=adam_beta2, epsilon=adam_epsilon)
        optimizer.exclude_from_weight_decay(var_names=["LayerNorm", "layer_norm", "bias"])
    else:
        optimizer = keras.optimizers.Adam(learning_rate=schedule, beta_1=adam_beta1, beta_2=adam_beta2,
                                          epsilon=adam_epsilon)
    return optimizer, schedule
