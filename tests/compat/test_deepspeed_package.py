"""DeepSpeed is one package, ``trainwell.backends.deepspeed``, whose top re-exports its modules' names.

The package and the top level of trainwell must hand out the very same objects as the modules, so that a config made
through one path is the live config seen through another, and importing the config (pure data) must not pull in
torch or DeepSpeed.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old,new", [
    ("trainwell.backends.deepspeed", "trainwell.backends.deepspeed.config"),
    ("trainwell.backends.deepspeed", "trainwell.backends.deepspeed.backend"),
    ("trainwell.backends.deepspeed", "trainwell.backends.deepspeed.weights"),
    ("trainwell.backends.deepspeed", "trainwell.backends.deepspeed.memory_estimates"),
])
def test_old_paths_give_the_same_objects(old, new):
    source, home = importlib.import_module(old), importlib.import_module(new)
    names = [name for name in getattr(source, "__all__", []) if hasattr(home, name)]
    assert names, f"{old} re-exports nothing from {new}"
    for name in names:
        assert getattr(source, name) is getattr(home, name), f"{old}.{name} is not {new}.{name}"


def test_every_exported_name_resolves():
    for path in ("trainwell.backends.deepspeed",):
        module = importlib.import_module(path)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{path}.{name}"
        assert set(module.__all__) <= set(dir(module)), path


def test_former_module_names_still_import():
    """What docs and user scripts import (names the upstream integration also has)."""
    from trainwell import HfDeepSpeedConfig, is_deepspeed_zero3_enabled
    from trainwell.backends.deepspeed import (DeepSpeedBackend, DeepSpeedConfig, check_deepspeed_files,
                                              resolve_deepspeed_config, zero_to_fp32)
    from trainwell.cli.commands.deepspeed_tools import cmd_estimate_memory, cmd_zero_to_fp32

    assert HfDeepSpeedConfig is DeepSpeedConfig
    assert callable(is_deepspeed_zero3_enabled) and callable(resolve_deepspeed_config)
    assert DeepSpeedBackend.__module__ == "trainwell.backends.deepspeed.backend"
    assert check_deepspeed_files.__module__ == "trainwell.backends.deepspeed.backend"
    assert zero_to_fp32.__module__ == "trainwell.backends.deepspeed.weights"
    assert cmd_zero_to_fp32.__module__ == cmd_estimate_memory.__module__ == "trainwell.cli.commands.deepspeed_tools"


def test_unknown_name_is_an_attribute_error():
    import trainwell.backends.deepspeed as package

    with pytest.raises(AttributeError, match="no attribute 'DeepSpeedEngine'"):
        package.DeepSpeedEngine


def test_live_config_is_shared_between_paths():
    """A ZeRO-3 config kept alive through the package is what its module (and trainwell's top level) sees."""
    import trainwell
    from trainwell.backends import deepspeed as deepspeed_config
    from trainwell.backends.deepspeed import config

    config.unset_deepspeed_config()
    try:
        live = deepspeed_config.DeepSpeedConfig({"zero_optimization": {"stage": 2}})
        assert config.get_deepspeed_config() is live
        assert not trainwell.is_deepspeed_zero3_enabled()
        live.config["zero_optimization"]["stage"] = 3
        assert config.is_deepspeed_zero3_enabled() and trainwell.is_deepspeed_zero3_enabled()
    finally:
        config.unset_deepspeed_config()
    assert not deepspeed_config.is_deepspeed_zero3_enabled()


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint([m for m in ('torch', 'deepspeed') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO,
                         timeout=300)
    return eval(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_config_is_pure_data():
    """The config module (TrainingArguments reads it) imports neither torch nor DeepSpeed, through any path."""
    assert _loaded_after("import trainwell.backends.deepspeed.config") == []
    assert _loaded_after("from trainwell import HfDeepSpeedConfig\n"
                         "c = HfDeepSpeedConfig({'zero_optimization': {'stage': 2}, 'train_batch_size': 'auto'})") == []
    assert _loaded_after("from trainwell.backends.deepspeed import resolve_deepspeed_config") == []
    assert "deepspeed" not in _loaded_after("from trainwell.backends.deepspeed import DeepSpeedBackend")
