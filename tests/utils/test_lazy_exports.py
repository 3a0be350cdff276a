"""``trainwell.utils.lazy_exports``: the packages' public names, imported on first use and cached."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("package", ["trainwell", "trainwell.checkpoint", "trainwell.data", "trainwell.backends"])
def test_every_listed_name_resolves_once_and_unknown_names_raise(package):
    import importlib

    module = importlib.import_module(package)
    names = module.__all__
    assert set(names) <= set(dir(module))
    for name in names:
        value = getattr(module, name)
        assert vars(module)[name] is value  # cached: the next lookup does not go through __getattr__
    with pytest.raises(AttributeError, match=rf"module '{package}' has no attribute 'no_such_name'"):
        module.no_such_name


@pytest.mark.slow
def test_a_name_loads_only_its_own_submodule():
    code = ("import sys, trainwell.data as d; before = 'trainwell.data.samplers' in sys.modules; "
            "d.default_data_collator; print(before, 'trainwell.data.collators' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "True"]
