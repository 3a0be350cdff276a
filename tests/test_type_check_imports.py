"""The type check sees every ``trainwell`` import: an import of a ``trainwell`` module that does not exist (moved or
deleted, even under ``TYPE_CHECKING``) is a type error, not a silent ``Any`` as a missing optional package is
(``[[tool.mypy.overrides]]`` for ``trainwell.*`` in pyproject.toml)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mypy")
pytestmark = pytest.mark.slow  # starts mypy in a process of its own


def _mypy(tmp_path: Path, source: str, *, follow: str) -> subprocess.CompletedProcess[str]:
    probe = tmp_path / "probe.py"
    probe.write_text(source)
    # the checkout's trainwell as source (MYPYPATH), whatever is installed; PYTHONPATH would make it "installed"
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "MYPYPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                           f"--follow-imports={follow}", "--cache-dir", str(tmp_path / "cache"), probe.name],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_missing_trainwell_module_fails_the_check(tmp_path: Path) -> None:
    result = _mypy(tmp_path, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from trainwell.callbacks.state import TrainerState\n", follow="skip")
    assert result.returncode == 1, result.stdout
    assert 'module named "trainwell.callbacks.state"' in result.stdout
    assert "import-not-found" in result.stdout


def test_a_missing_name_in_a_trainwell_module_fails_the_check(tmp_path: Path) -> None:
    result = _mypy(tmp_path, "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                             "    from trainwell.utils.trainer_state import TrainerStat\n", follow="silent")
    assert result.returncode == 1, result.stdout
    assert 'has no attribute "TrainerStat"' in result.stdout


def test_a_missing_optional_package_stays_any(tmp_path: Path) -> None:
    """The contrast: an optional package that is not installed is not an error (it types as ``Any``)."""
    result = _mypy(tmp_path, "import a_package_that_is_not_installed_anywhere\n"
                             "from trainwell.utils.trainer_state import TrainerState\n", follow="skip")
    assert result.returncode == 0, result.stdout
