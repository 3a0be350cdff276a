"""A Trainer subclass for extractive question answering, in the shape of upstream's question-answering/trainer_qa.py:
``evaluate`` and ``predict`` run ``evaluation_loop`` without metrics on the features, map the logits back to answers
on the examples (``post_process_function``), then compute, log and report the metrics themselves."""

import math
import time

from transformers import Trainer
from transformers.trainer_utils import PredictionOutput, speed_metrics


class QuestionAnsweringTrainer(Trainer):
    """Trainer whose evaluation post-processes the start/end logits into answer texts."""

    def __init__(self, *args, eval_examples=None, post_process_function=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.eval_examples = eval_examples
        self.post_process_function = post_process_function

    def _predict_without_metrics(self, dataloader, description, prefix):
        compute_metrics, self.compute_metrics = self.compute_metrics, None
        start = time.time()
        try:
            output = self.evaluation_loop(dataloader, description=description,
                                          prediction_loss_only=True if compute_metrics is None else None,
                                          ignore_keys=None, metric_key_prefix=prefix)
        finally:
            self.compute_metrics = compute_metrics
        total_batch_size = self.args.eval_batch_size * self.args.world_size
        output.metrics.update(speed_metrics(prefix, start, num_samples=output.num_samples,
                                            num_steps=math.ceil(output.num_samples / total_batch_size)))
        return output

    def evaluate(self, eval_dataset=None, eval_examples=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        eval_dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        eval_examples = self.eval_examples if eval_examples is None else eval_examples
        dataloader = self.get_eval_dataloader(eval_dataset)
        output = self._predict_without_metrics(dataloader, "Evaluation", metric_key_prefix)
        if self.post_process_function is not None and self.compute_metrics is not None and self.args.should_save:
            predictions = self.post_process_function(eval_examples, eval_dataset, output.predictions)
            metrics = self.compute_metrics(predictions)
            metrics = {(k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}"): v
                       for k, v in metrics.items()}
            metrics.update(output.metrics)
        else:
            metrics = output.metrics
        if self.args.should_log:
            self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def predict(self, predict_dataset, predict_examples, ignore_keys=None, metric_key_prefix: str = "test"):
        dataloader = self.get_test_dataloader(predict_dataset)
        output = self._predict_without_metrics(dataloader, "Prediction", metric_key_prefix)
        if self.post_process_function is None or self.compute_metrics is None:
            return output
        predictions = self.post_process_function(predict_examples, predict_dataset, output.predictions, "predict")
        metrics = self.compute_metrics(predictions)
        metrics = {(k if k.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{k}"): v
                   for k, v in metrics.items()}
        metrics.update(output.metrics)
        return PredictionOutput(predictions=predictions.predictions, label_ids=predictions.label_ids,
                                metrics=metrics)
