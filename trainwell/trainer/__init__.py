"""The facade users subclass: ``Trainer`` (trainer.py, every upstream method name) and the parts it is made of
(hub.py, upstream_calls.py, accelerator.py...), and ``Seq2SeqTrainer`` (seq2seq.py); the checkpoint policy the Trainer
delegates to is the ``checkpointing`` subpackage."""
