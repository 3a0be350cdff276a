"""The suite writes nothing into the user's home: every home and cache folder points under pytest's base temp folder
(tests/conftest.py sets them before collection, because several libraries read them when imported)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_home_and_caches_are_under_the_session_temp_folder(tmp_path_factory):
    base = tmp_path_factory.getbasetemp().resolve()
    for name in ("HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_DATASETS_CACHE", "WANDB_DIR", "KERAS_HOME"):
        assert Path(os.environ[name]).resolve().is_relative_to(base), (name, os.environ[name])
    assert Path(os.path.expanduser("~")).resolve().is_relative_to(base)


def test_hf_datasets_cache_read_at_import_is_private(tmp_path_factory):
    config = pytest.importorskip("datasets.config")
    assert Path(config.HF_DATASETS_CACHE).resolve().is_relative_to(tmp_path_factory.getbasetemp().resolve())
