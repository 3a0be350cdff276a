"""What the tests share: tiny models (:mod:`helpers.models`), tiny datasets (:mod:`helpers.data`), snapshots of
weights (:mod:`helpers.tensors`), shared callbacks (:mod:`helpers.callbacks`), the optimizer factory's arguments (:mod:`helpers.optim_args`) and starting jobs in child processes (:mod:`helpers.launch`). The 2-rank job scripts
of ``tests/distributed`` share theirs in ``tests/distributed/jobs.py`` (torchrun runs them with only their folder on
``sys.path``).

Imported as ``helpers`` (pytest puts ``tests/`` on ``sys.path``: ``tests/conftest.py`` lives there); a job script run
in a child process puts ``tests/`` first on its ``sys.path``. ``helpers.launch`` is not imported here: it imports
pytest, which a job does not need.
"""

from __future__ import annotations

from helpers.data import NormalRows, classification_data, regression_data, token_data
from helpers.models import BlockStack, ClassifierModel, RegressionModel, TokenLM, TokenLMNoKwargs

__all__ = ["BlockStack", "ClassifierModel", "NormalRows", "RegressionModel", "TokenLM", "TokenLMNoKwargs",
           "classification_data", "regression_data", "token_data", "train_until_preempted"]


def train_until_preempted(trainer, **kwargs):
    """``trainer.train(**kwargs)`` on a run that a signal preempts: the ``TrainOutput`` the ``TrainingPreempted``
    it must raise carries (a script would exit with 130/143 there); fails when ``train()`` returns instead."""
    from trainwell import TrainingPreempted

    try:
        trainer.train(**kwargs)
    except TrainingPreempted as stop:
        return stop.output
    raise AssertionError("train() returned normally: the run was not preempted")
