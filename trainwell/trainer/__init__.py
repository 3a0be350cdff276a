"""The facade users subclass: ``Trainer`` (trainer.py, every upstream method name) and the parts it is made of
(checkpoints.py, hub.py, compat.py, accelerator.py), and ``Seq2SeqTrainer`` (seq2seq.py)."""
