"""Fixtures of the example-script suite: the offline world (tokenizer, tiny models, data files), built once."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder :mod:`examples_world` builds: a tokenizer, one tiny model per task (dropout 0) and the data."""
    pytest.importorskip("transformers")
    import examples_world

    folder = tmp_path_factory.mktemp("examples_world")
    examples_world.build(folder)
    return folder
