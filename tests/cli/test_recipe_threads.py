"""The built-in recipe trains on one torch thread unless the user chose a count (OMP_NUM_THREADS): a second thread
gains little for its small model and, on a busy 2-core machine, made the run 7x slower (docs/performance.md)."""

from __future__ import annotations

import pytest
import torch

from trainwell.cli.main import use_recipe_threads
from trainwell.cli.recipes import default_recipe


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_built_in_recipe_uses_one_thread_unless_the_user_chose(threads):
    recipe = default_recipe()
    torch.set_num_threads(2)
    assert use_recipe_threads(recipe, environ={}) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert use_recipe_threads(recipe, environ={"OMP_NUM_THREADS": "2"}) is None and torch.get_num_threads() == 2
    recipe.num_threads = None  # a user recipe keeps torch's default
    assert use_recipe_threads(recipe, environ={}) is None and torch.get_num_threads() == 2
