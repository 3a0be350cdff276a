"""DDP's ``find_unused_parameters`` rule reads a transformers model's activation-checkpointing switch without
touching the deprecated alias (transformers 5.x warns a FutureWarning on every read, once per rank)."""

from __future__ import annotations

import warnings

from torch import nn

from trainwell.backends.ddp import _model_checkpoints_activations


class _Model5x(nn.Module):  # transformers 5.x's two properties
    checkpointing = False

    @property
    def is_activation_checkpointing(self) -> bool:
        return self.checkpointing

    @property
    def is_gradient_checkpointing(self) -> bool:
        warnings.warn("`is_gradient_checkpointing` is deprecated", FutureWarning)
        return self.checkpointing


class _Model4x(nn.Module):  # older releases: only the old name
    is_gradient_checkpointing = True


def test_the_deprecated_alias_is_not_read_when_the_new_switch_exists():
    model = _Model5x()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _model_checkpoints_activations(model) is False
        model.checkpointing = True
        assert _model_checkpoints_activations(model) is True


def test_older_models_still_answer_through_the_old_name():
    assert _model_checkpoints_activations(_Model4x()) is True
    assert _model_checkpoints_activations(nn.Linear(1, 1)) is False
    assert _model_checkpoints_activations(None) is False
