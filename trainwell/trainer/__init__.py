"""The facade users subclass: ``Trainer`` (trainer.py, every upstream method name) and the parts it is made of
(hub.py, upstream_calls.py, accelerator.py...), and ``Seq2SeqTrainer`` (seq2seq.py); the checkpoint policy the Trainer
delegates to is the ``checkpointing`` subpackage."""

import logging

#: the Trainer's logger (``trainwell.trainer.trainer``, upstream's ``transformers.trainer.logger`` under trainwell's
#: name): the one object every part of the Trainer warns through, so ``mock.patch("trainwell.trainer.logger.warning")``
#: sees their warnings as upstream's tests see the Trainer's
logger = logging.getLogger("trainwell.trainer.trainer")
