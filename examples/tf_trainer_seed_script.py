"""A script written for the seed's (transformers 4.x) TFTrainer, running on trainwell with only the import changed.

Was:  from transformers import EvalPrediction, HfArgumentParser, TFTrainer, TFTrainingArguments
Now:  the two imports below. The model is a Keras model following the TFTrainer contract (called with labels it
returns (loss, logits)), since no TensorFlow transformers models exist any more.

    python examples/tf_trainer_seed_script.py --output_dir out --do_train --do_eval --max_steps 50
"""

import logging
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from trainwell import EvalPrediction, HfArgumentParser
from trainwell.tf import TFTrainer, TFTrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    hidden_size: int = field(default=32, metadata={"help": "Width of the hidden layer."})


@dataclass
class DataTrainingArguments:
    n_eval: int = field(default=297, metadata={"help": "Examples held out for evaluation."})


class Classifier(tf.keras.Model):
    def __init__(self, hidden_size: int, num_labels: int = 10):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(hidden_size, activation="relu")
        self.classifier = tf.keras.layers.Dense(num_labels)

    def call(self, inputs, labels=None, training=False):
        logits = self.classifier(self.hidden(inputs["pixels"]))
        if labels is None:
            return (logits,)
        loss = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        return loss, logits


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TFTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    logging.basicConfig(level=logging.INFO)
    logger.info("n_replicas: %s, training/evaluation parameters %s", training_args.n_replicas, training_args)

    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("int64")
    split = len(x) - data_args.n_eval
    train_dataset = tf.data.Dataset.from_tensor_slices(({"pixels": x[:split]}, y[:split]))
    eval_dataset = tf.data.Dataset.from_tensor_slices(({"pixels": x[split:]}, y[split:]))

    with training_args.strategy.scope():
        model = Classifier(model_args.hidden_size)

    def compute_metrics(p: EvalPrediction):
        preds = np.argmax(p.predictions, axis=1)
        return {"accuracy": (preds == p.label_ids).mean()}

    trainer = TFTrainer(model=model, args=training_args, train_dataset=train_dataset, eval_dataset=eval_dataset,
                        compute_metrics=compute_metrics)
    if training_args.do_train:
        trainer.train()
        trainer.save_model()
    results = {}
    if training_args.do_eval:
        result = trainer.evaluate()
        print("***** Eval results *****")
        for key, value in result.items():
            print(f"  {key} = {value}")
        results.update(result)
    return results


if __name__ == "__main__":
    main()
