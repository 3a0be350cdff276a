"""``TFTrainer``: upstream's "simple but feature-complete training and eval loop for TensorFlow".

Datasets yield ``(features, labels)``; the model, called as ``model(features, labels=labels, training=...)`` (or
``model(features, **labels, training=...)`` for dict labels), returns ``(loss, logits)`` (a tuple, a dict with
``loss``/``logits`` or an object with those attributes). The loss may be per example (summed over the batch, the
transformers TF convention) or a scalar mean over the batch's items. Each step divides the summed loss by the
number of labelled items (labels != -100) of the whole global batch (all replicas, all accumulation slices), so
the gradient is that of the mean over the global batch whatever the split: 2 replicas x 4 or 2 accumulation
slices x 4 equal one batch of 8. Gradients are clipped to ``max_grad_norm`` by their global norm (computed on the
gradient summed over replicas), then applied by the Keras optimizer.

Checkpoints are ``tf.train.Checkpoint`` files (model + optimizer, whose ``iterations`` is the global step) in
``output_dir/checkpoint`` managed by a ``tf.train.CheckpointManager`` (``save_total_limit`` = ``max_to_keep``);
``train()`` resumes from the latest one found there, skipping the batches already trained on (the training
stream is deterministic given ``seed``), unless ``ignore_data_skip``.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import random
import threading
from typing import TYPE_CHECKING, Any, Callable, cast

import numpy as np
import tensorflow as tf

from ...trainer.checkpointing.output_dir_runs import require_output_dir
from ...utils.checkpoint_names import PREFIX_CHECKPOINT_DIR
from ...utils.option_enums import IntervalStrategy, SaveStrategy
from ...utils.outputs import EvalPrediction, PredictionOutput
from .args import TFTrainingArguments
from .optimization import create_optimizer

if TYPE_CHECKING:
    from comet_ml.experiment import CometExperiment

logger = logging.getLogger(__name__)

_TRUE = {"1", "ON", "YES", "TRUE"}


def _cardinality(dataset: tf.data.Dataset, what: str) -> int:
    n = int(dataset.cardinality().numpy())
    if n < 0:
        raise ValueError(f"The {what} dataset must have an asserted cardinality (got {n}: infinite or unknown); "
                         "use a finite dataset or dataset.apply(tf.data.experimental.assert_cardinality(n)).")
    return n


def _to_numpy(value: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else np.asarray(t), value)


def _concat(parts: list[Any]) -> Any:
    return tf.nest.map_structure(lambda *xs: np.concatenate(xs, axis=0), *parts)


class TFTrainer:
    """Train, evaluate and predict with a Keras model under a ``tf.distribute`` strategy (upstream API)."""

    _past: Any  # a past_index model's memory: set by run_model, deleted after a loop

    def __init__(self, model: tf.keras.Model, args: TFTrainingArguments, train_dataset: tf.data.Dataset | None = None,
                 eval_dataset: tf.data.Dataset | None = None,
                 compute_metrics: Callable[[EvalPrediction], dict] | None = None,
                 tb_writer: tf.summary.SummaryWriter | None = None,
                 optimizers: tuple[Any, Any] = (None, None)) -> None:
        if not isinstance(args, TFTrainingArguments):
            raise TypeError(f"TFTrainer needs args=TFTrainingArguments(...), got {type(args).__name__}; "
                            "TrainingArguments is the PyTorch Trainer's.")
        self.model = model
        self.args = args
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.compute_metrics = compute_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.global_step = 0
        self.epoch_logging = 0.0
        self.log_history: list[dict[str, float]] = []
        self.tb_writer = tb_writer if tb_writer is not None else tf.summary.create_file_writer(args.logging_dir)
        self._wandb: Any = None
        self._comet: Any = None
        self._local = threading.local()  # per-replica (per-thread under MirroredStrategy) step losses
        report_to = cast("list[str]", args.report_to)  # a list once TrainingArguments.__post_init__ ran
        if "wandb" in report_to and os.getenv("WANDB_DISABLED", "").upper() not in _TRUE:
            self.setup_wandb()
        if "comet_ml" in report_to and os.getenv("COMET_MODE", "").upper() != "DISABLED":
            self.setup_comet()
        random.seed(args.seed)
        np.random.seed(args.seed % 2**32)
        tf.random.set_seed(args.seed)

    # ------------------------------------------------------------------ datasets
    def get_train_tfdataset(self) -> tf.distribute.DistributedDataset:
        """The training batches: shuffled each epoch (``seed``), repeated, in global batches of
        ``train_batch_size * gradient_accumulation_steps``, distributed over the replicas."""
        if self.train_dataset is None:
            raise ValueError("Trainer: training requires a train_dataset.")
        self.total_train_batch_size = self.args.train_batch_size * self.args.gradient_accumulation_steps
        self.num_train_examples = _cardinality(self.train_dataset, "training")
        if self.num_train_examples == 0:
            raise ValueError("The training dataset is empty.")
        ds = (self.train_dataset.shuffle(self.num_train_examples, seed=self.args.seed, reshuffle_each_iteration=True)
              .repeat().batch(self.total_train_batch_size, drop_remainder=True))
        skip = getattr(self, "_batches_to_skip", 0)
        if skip:
            ds = ds.skip(skip)
        return self.args.strategy.experimental_distribute_dataset(ds.prefetch(tf.data.AUTOTUNE))

    def _batched(self, dataset: tf.data.Dataset, what: str) -> tuple[tf.distribute.DistributedDataset, int, int]:
        num_examples = _cardinality(dataset, what)
        bs = self.args.eval_batch_size
        drop = self.args.dataloader_drop_last
        steps = (num_examples // bs) if drop else math.ceil(num_examples / bs)
        ds = dataset.batch(bs, drop_remainder=drop).prefetch(tf.data.AUTOTUNE)
        return self.args.strategy.experimental_distribute_dataset(ds), steps, num_examples

    def get_eval_tfdataset(self, eval_dataset: tf.data.Dataset | None = None
                           ) -> tuple[tf.distribute.DistributedDataset, int, int]:
        """(distributed evaluation batches, steps, number of examples); each example is seen exactly once."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        return self._batched(eval_dataset if eval_dataset is not None else self.eval_dataset, "evaluation")

    def get_test_tfdataset(self, test_dataset: tf.data.Dataset) -> tuple[tf.distribute.DistributedDataset, int, int]:
        """(distributed test batches, steps, number of examples)."""
        return self._batched(test_dataset, "test")

    # ------------------------------------------------------------------ optimizer and trackers
    def create_optimizer_and_scheduler(self, num_training_steps: int) -> None:
        """Adam/AdamW with polynomial decay (``poly_power``) and warmup, unless ``optimizers`` were given."""
        if not self.optimizer and not self.lr_scheduler:
            args = self.args
            ratio = args.warmup_ratio or 0  # None: no warmup, as TrainingArguments.get_warmup_steps reads it
            warmup = args.warmup_steps if args.warmup_steps > 0 else math.ceil(num_training_steps * ratio)
            self.optimizer, self.lr_scheduler = create_optimizer(
                args.learning_rate, num_training_steps, int(warmup), adam_beta1=args.adam_beta1,
                adam_beta2=args.adam_beta2, adam_epsilon=args.adam_epsilon, weight_decay_rate=args.weight_decay,
                power=args.poly_power)
        if self.args.fp16 and not isinstance(self.optimizer, tf.keras.optimizers.LossScaleOptimizer):
            self.optimizer = tf.keras.optimizers.LossScaleOptimizer(self.optimizer)

    def setup_wandb(self) -> None:
        """Start a Weights & Biases run (``WANDB_PROJECT``, default "huggingface"; ``WANDB_MODE=offline`` works
        without an account); called when ``report_to`` has "wandb" and ``WANDB_DISABLED`` is not true."""
        import wandb

        config = {**self._model_config(), **self.args.to_sanitized_dict()}
        self._wandb = wandb
        if wandb.run is None:
            wandb.init(project=os.getenv("WANDB_PROJECT", "huggingface"), config=config, name=self.args.run_name)

    def setup_comet(self) -> None:
        """Start a Comet.ml experiment: ``COMET_MODE`` ONLINE (default) or OFFLINE (into
        ``COMET_OFFLINE_DIRECTORY``), ``COMET_PROJECT_NAME`` (default "huggingface")."""
        import comet_ml

        mode = os.getenv("COMET_MODE", "ONLINE").upper()
        kwargs: dict[str, Any] = {"project_name": os.getenv("COMET_PROJECT_NAME", "huggingface")}
        experiment: CometExperiment
        if mode == "OFFLINE":
            kwargs["offline_directory"] = os.getenv("COMET_OFFLINE_DIRECTORY", "./")
            experiment = comet_ml.OfflineExperiment(**kwargs)
        else:
            experiment = comet_ml.Experiment(**kwargs)
        self._comet = experiment
        experiment.log_parameters(self.args.to_sanitized_dict(), prefix="args/")
        if self._model_config():
            experiment.log_parameters(self._model_config(), prefix="config/")

    def _model_config(self) -> dict[str, Any]:
        config: Any = getattr(self.model, "config", None)
        return config.to_dict() if hasattr(config, "to_dict") else {}

    def log(self, logs: dict[str, float]) -> None:
        """Send ``logs`` (plus ``epoch``) to TensorBoard, W&B and Comet when set up, and to the logger."""
        logs["epoch"] = self.epoch_logging
        if self.tb_writer:
            with self.tb_writer.as_default():
                for k, v in logs.items():
                    tf.summary.scalar(k, v, step=self.global_step)
            self.tb_writer.flush()
        if self._wandb is not None:
            self._wandb.log(logs, step=self.global_step)
        if self._comet is not None:
            self._comet.log_metrics(logs, step=self.global_step, epoch=self.epoch_logging)
        output = {**logs, "step": self.global_step}
        self.log_history.append(output)
        logger.info(output)

    # ------------------------------------------------------------------ model calls
    def run_model(self, features: Any, labels: Any, training: bool) -> tuple[Any, Any]:
        """(loss, logits) of the model on ``features`` and ``labels`` (loss None without labels)."""
        if self.args.past_index >= 0 and getattr(self, "_past", None) is not None:
            features["mems"] = self._past
        if labels is None:
            outputs = self.model(features, training=training)
        elif isinstance(labels, dict):
            outputs = self.model(features, training=training, **labels)
        else:
            outputs = self.model(features, labels=labels, training=training)
        if isinstance(outputs, dict):
            loss, logits = outputs.get("loss"), outputs.get("logits")
        elif isinstance(outputs, (tuple, list)):
            loss, logits = (outputs[0], outputs[1]) if labels is not None else (None, outputs[0])
        elif hasattr(outputs, "logits"):
            loss, logits = getattr(outputs, "loss", None), outputs.logits
        else:
            loss, logits = None, outputs
        if labels is not None and loss is None:
            raise ValueError("The model returned no loss when called with labels: TFTrainer needs a model that "
                             "returns (loss, logits) for model(features, labels=labels, training=...).")
        if self.args.past_index >= 0:
            self._past = outputs[self.args.past_index]
        return loss, logits

    @staticmethod
    def _local_count(labels: Any) -> tf.Tensor:
        if isinstance(labels, dict):
            return tf.shape(tf.nest.flatten(labels)[0])[0]
        return tf.reduce_sum(tf.cast(tf.not_equal(labels, tf.cast(-100, labels.dtype)), tf.int32))

    def _scaled_loss(self, loss: tf.Tensor, labels: Any, nb_instances_in_global_batch: tf.Tensor) -> tf.Tensor:
        loss = tf.cast(loss, tf.float32)
        if loss.shape.rank == 0:  # a mean over this replica's items: back to a sum (0 for an empty slice)
            n_local = tf.cast(self._local_count(labels), tf.float32)
            loss_sum = tf.where(n_local > 0, loss * n_local, 0.0)
        else:
            loss_sum = tf.reduce_sum(loss)
        return loss_sum / tf.cast(tf.maximum(nb_instances_in_global_batch, 1), tf.float32)

    def _record_loss(self, scaled_loss: tf.Tensor) -> None:
        losses = getattr(self._local, "losses", None)
        if losses is not None:
            losses.append(scaled_loss)

    def _take_losses(self) -> tf.Tensor:
        losses, self._local.losses = getattr(self._local, "losses", None) or [], None
        return tf.add_n(losses) if losses else tf.constant(0.0)

    # ------------------------------------------------------------------ training
    def training_step(self, features: Any, labels: Any, nb_instances_in_global_batch: tf.Tensor) -> list[tf.Tensor]:
        """The gradients of this slice's loss sum divided by the global batch's labelled items."""
        with tf.GradientTape() as tape:
            per_example_loss, _ = self.run_model(features, labels, True)
            scaled_loss = self._scaled_loss(per_example_loss, labels, nb_instances_in_global_batch)
            to_differentiate = (self.optimizer.scale_loss(scaled_loss)
                                if isinstance(self.optimizer, tf.keras.optimizers.LossScaleOptimizer)
                                else scaled_loss)
        variables = self.model.trainable_variables
        gradients = tape.gradient(to_differentiate, variables)
        self._record_loss(scaled_loss)
        return [g if g is not None else tf.zeros_like(v) for g, v in zip(gradients, variables)]

    def apply_gradients(self, features: Any, labels: Any, nb_instances_in_global_batch: tf.Tensor) -> tf.Tensor:
        """Accumulate ``training_step`` over ``gradient_accumulation_steps`` slices of this replica's batch, clip
        by global norm and apply; returns this replica's share of the batch loss."""
        self._local.losses = []
        steps = self.args.gradient_accumulation_steps
        size = self.args.per_device_train_batch_size
        gradients: list[tf.Tensor] = []
        for i in range(steps):
            if steps == 1:
                f, lab = features, labels
            else:
                f, lab = tf.nest.map_structure(lambda t, i=i: t[i * size:(i + 1) * size], (features, labels))
            grads = self.training_step(f, lab, nb_instances_in_global_batch)
            gradients = [a + b for a, b in zip(gradients, grads)] if i else grads
        if self.args.max_grad_norm:
            gradients = self._clip(gradients)
        self.optimizer.apply_gradients(list(zip(gradients, self.model.trainable_variables)))
        return self._take_losses()

    def _clip(self, gradients: list[tf.Tensor]) -> list[tf.Tensor]:
        # The norm of the gradient summed over replicas (what the optimizer applies): clip every replica's part
        # by the same factor so the sum is clipped exactly.
        total = gradients
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
        norm = tf.linalg.global_norm(total)
        if isinstance(self.optimizer, tf.keras.optimizers.LossScaleOptimizer):
            norm = norm / tf.cast(self.optimizer.dynamic_scale, norm.dtype)
        factor = tf.minimum(1.0, self.args.max_grad_norm / tf.maximum(norm, 1e-12))
        return [g * tf.cast(factor, g.dtype) for g in gradients]

    def _nb_instances(self, labels: Any) -> tf.Tensor:
        first = tf.nest.flatten(labels)[0] if isinstance(labels, dict) else labels
        values = self.args.strategy.experimental_local_results(first)
        return tf.add_n([self._local_count({"x": v} if isinstance(labels, dict) else v) for v in values])

    def distributed_training_steps(self, batch: Any) -> tf.Tensor:
        """One optimizer step on a distributed global batch; returns the batch's mean loss."""
        features, labels = batch
        nb = self._nb_instances(labels)
        per_replica = self.args.strategy.run(self.apply_gradients, (features, labels, nb))
        if per_replica is None:  # an apply_gradients override that returns nothing
            return tf.constant(0.0)
        return self.args.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return tf.function(fn, jit_compile=True) if self.args.xla else tf.function(fn)

    def _checkpoint_manager(self) -> tuple[tf.train.Checkpoint, tf.train.CheckpointManager]:
        folder = os.path.join(require_output_dir(self.args.output_dir), PREFIX_CHECKPOINT_DIR)
        ckpt = tf.train.Checkpoint(optimizer=self.optimizer, model=self.model)
        limit = self.args.save_total_limit
        manager = tf.train.CheckpointManager(ckpt, folder, max_to_keep=limit if limit else None)
        self.model.ckpt_manager = manager
        return ckpt, manager

    def _build(self, batch: Any) -> None:
        """Create the model's and the optimizer's variables (so a checkpoint restores into them)."""
        features, labels = batch
        strategy = self.args.strategy
        first = lambda x: strategy.experimental_local_results(x)[0]  # noqa: E731
        self.run_model(tf.nest.map_structure(first, features), tf.nest.map_structure(first, labels), False)
        self.optimizer.build(self.model.trainable_variables)

    def _steps_plan(self) -> tuple[int, int]:
        approx = math.floor if self.args.dataloader_drop_last else math.ceil
        self.steps_per_epoch = max(1, approx(self.num_train_examples / self.total_train_batch_size))
        if self.args.max_steps > 0:
            return self.args.max_steps, self.steps_per_epoch
        return max(1, math.ceil(self.steps_per_epoch * self.args.num_train_epochs)), self.steps_per_epoch

    def train(self) -> None:
        """Train the model (resuming from the latest checkpoint in ``output_dir/checkpoint`` if there is one)."""
        args = self.args
        self._batches_to_skip = 0
        self.get_train_tfdataset()  # validates the dataset, sets num_train_examples / total_train_batch_size
        t_total, steps_per_epoch = self._steps_plan()
        strategy = args.strategy
        with strategy.scope():
            self.create_optimizer_and_scheduler(num_training_steps=t_total)
            ckpt, manager = self._checkpoint_manager()
            self._build(next(iter(self.get_train_tfdataset())))
            if args.resume_from_checkpoint and isinstance(args.resume_from_checkpoint, str):
                path = args.resume_from_checkpoint
                latest = tf.train.latest_checkpoint(path) if os.path.isdir(path) else path
                if latest is None:
                    raise ValueError(f"resume_from_checkpoint={path!r} holds no tf.train checkpoint.")
            else:
                latest = manager.latest_checkpoint
            if latest:
                logger.info("Checkpoint file %s found and restoring from checkpoint", latest)
                ckpt.restore(latest).assert_existing_objects_matched()
            self.global_step = int(self.optimizer.iterations.numpy())
            if self.global_step and not args.ignore_data_skip:
                self._batches_to_skip = self.global_step
            train_ds = self.get_train_tfdataset()
            step_fn = self._compile(self.distributed_training_steps)
            with self.tb_writer.as_default():
                tf.summary.text("args", args.to_json_string(), step=self.global_step)
            self.tb_writer.flush()
            logger.info("***** Running training *****")
            logger.info("  Num examples = %d, total optimization steps = %d, replicas = %d", self.num_train_examples,
                        t_total, args.n_replicas)
            start = datetime.datetime.now()
            self._run_steps(iter(train_ds), step_fn, manager, t_total, steps_per_epoch)
            logger.info("Training took: %s", datetime.datetime.now() - start)
        if args.past_index and hasattr(self, "_past"):
            delattr(self, "_past")

    def _run_steps(self, iterator: Any, step_fn: Callable[..., Any], manager: tf.train.CheckpointManager,
                   t_total: int, steps_per_epoch: int) -> None:
        args = self.args
        # Intervals below 1 are fractions of the whole training (as TrainingArguments documents).
        log_every, eval_every, save_every = (math.ceil(n * t_total) if n and 0 < n < 1 else n for n in
                                             (args.logging_steps, args.eval_steps, args.save_steps))
        loss_sum, loss_steps = tf.constant(0.0), 0
        while self.global_step < t_total:
            loss_sum += step_fn(next(iterator))
            loss_steps += 1
            self.global_step += 1
            self.epoch_logging = self.global_step / steps_per_epoch
            epoch_end = self.global_step % steps_per_epoch == 0
            every = lambda n: n and n > 0 and self.global_step % int(n) == 0  # noqa: E731
            if ((args.logging_strategy == IntervalStrategy.STEPS and every(log_every))
                    or (args.logging_strategy == IntervalStrategy.EPOCH and epoch_end)
                    or (self.global_step == 1 and args.logging_first_step)):
                logs = {"loss": float(loss_sum.numpy()) / loss_steps, "learning_rate": self._current_lr()}
                loss_sum, loss_steps = tf.constant(0.0), 0
                self.log(logs)
            if ((args.eval_strategy == IntervalStrategy.STEPS and every(eval_every))
                    or (args.eval_strategy == IntervalStrategy.EPOCH and epoch_end)):
                self.evaluate()
            if ((args.save_strategy == SaveStrategy.STEPS and every(save_every))
                    or (args.save_strategy == SaveStrategy.EPOCH and epoch_end)):
                path = manager.save(checkpoint_number=self.global_step)
                logger.info("Saving checkpoint for step %d at %s", self.global_step, path)

    def _current_lr(self) -> float:
        if self.lr_scheduler is not None:
            return float(self.lr_scheduler(self.global_step).numpy())
        return float(tf.convert_to_tensor(self.optimizer.learning_rate).numpy())

    # ------------------------------------------------------------------ evaluation and prediction
    def prediction_step(self, features: Any, labels: Any, nb_instances_in_global_batch: tf.Tensor) -> Any:
        """The logits of this slice; its loss (divided by the global batch's labelled items) is recorded."""
        per_example_loss, logits = self.run_model(features, labels, False)
        if labels is not None:
            self._record_loss(self._scaled_loss(per_example_loss, labels, nb_instances_in_global_batch)
                              * tf.cast(nb_instances_in_global_batch, tf.float32))
        return logits

    def _replica_prediction(self, features: Any, labels: Any, nb: tf.Tensor) -> tuple[Any, tf.Tensor]:
        self._local.losses = []
        logits = self.prediction_step(features, labels, nb)
        return logits, self._take_losses()

    def distributed_prediction_steps(self, batch: Any) -> tuple[Any, tf.Tensor, tf.Tensor]:
        """(per-replica logits, summed loss, number of labelled items) of one distributed batch."""
        features, labels = batch if isinstance(batch, (tuple, list)) and len(batch) == 2 else (batch, None)
        nb = self._nb_instances(labels) if labels is not None else tf.constant(0)
        logits, loss = self.args.strategy.run(self._replica_prediction, (features, labels, nb))
        return logits, self.args.strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None), nb

    def prediction_loop(self, dataset: tf.distribute.DistributedDataset, steps: int, num_examples: int,
                        description: str, prediction_loss_only: bool | None = None) -> PredictionOutput:
        """Shared by :meth:`evaluate` and :meth:`predict`; works with or without labels. ``eval_loss`` is the
        mean loss over the labelled items; predictions and labels hold each example once, in order."""
        args = self.args
        loss_only = prediction_loss_only if prediction_loss_only is not None else args.prediction_loss_only
        logger.info("***** Running %s *****  Num examples = %d, batch size = %d", description, num_examples,
                    args.eval_batch_size)
        if args.past_index >= 0:
            self._past = None
        step_fn = self._compile(self.distributed_prediction_steps)
        local = self.args.strategy.experimental_local_results
        preds: list[Any] = []
        label_parts: list[Any] = []
        loss_sum, n_items = tf.constant(0.0), tf.constant(0)
        has_labels = False
        for step, batch in enumerate(dataset):
            if step == steps:
                break
            logits, loss, count = step_fn(batch)
            labels = batch[1] if isinstance(batch, (tuple, list)) and len(batch) == 2 else None
            if labels is not None:
                has_labels = True
                loss_sum += loss
                n_items += count
            if not loss_only:
                logits = logits[0] if isinstance(logits, (tuple, list)) else logits
                preds.extend(_to_numpy(v) for v in local(logits))
                if labels is not None:
                    labels = labels[0] if isinstance(labels, (tuple, list)) else labels
                    if isinstance(labels, dict):
                        label_parts.append({k: _concat([_to_numpy(v) for v in local(t)]) for k, t in labels.items()})
                    else:
                        label_parts.extend(_to_numpy(v) for v in local(labels))
        predictions = _concat(preds) if preds else None
        label_ids = _concat(label_parts) if label_parts else None
        if self.compute_metrics is not None and predictions is not None and label_ids is not None:
            metrics = dict(self.compute_metrics(EvalPrediction(predictions=predictions, label_ids=label_ids)))
        else:
            metrics = {}
        if has_labels:
            metrics["eval_loss"] = float(loss_sum.numpy()) / max(int(n_items.numpy()), 1)
        for key in list(metrics):
            if not key.startswith("eval_"):
                metrics[f"eval_{key}"] = metrics.pop(key)
        if args.past_index and hasattr(self, "_past"):
            delattr(self, "_past")
        return PredictionOutput(predictions=predictions, label_ids=label_ids, metrics=metrics)

    def evaluate(self, eval_dataset: tf.data.Dataset | None = None) -> dict[str, float]:
        """Run evaluation, log and return the metrics (``eval_loss`` and ``compute_metrics``'s, ``eval_``-prefixed)."""
        eval_ds, steps, num_examples = self.get_eval_tfdataset(eval_dataset)
        with self.args.strategy.scope():
            output = self.prediction_loop(eval_ds, steps, num_examples, description="Evaluation")
        metrics = cast("dict[str, float]", output.metrics)  # prediction_loop always fills them
        self.log({**metrics})
        return metrics

    def predict(self, test_dataset: tf.data.Dataset) -> PredictionOutput:
        """Predictions (and labels and metrics when the dataset has labels) on ``test_dataset``."""
        test_ds, steps, num_examples = self.get_test_tfdataset(test_dataset)
        with self.args.strategy.scope():
            return self.prediction_loop(test_ds, steps, num_examples, description="Prediction")

    def save_model(self, output_dir: str | None = None) -> None:
        """Save the model: ``save_pretrained`` when the model has it, else Keras weights in
        ``output_dir/tf_model.weights.h5`` (reload with ``model.load_weights``)."""
        output_dir = output_dir if output_dir is not None else require_output_dir(self.args.output_dir)
        logger.info("Saving model in %s", output_dir)
        os.makedirs(output_dir, exist_ok=True)
        if hasattr(self.model, "save_pretrained"):
            self.model.save_pretrained(output_dir)
        else:
            self.model.save_weights(os.path.join(output_dir, "tf_model.weights.h5"))
