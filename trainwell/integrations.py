"""``trainwell.integrations``, under upstream's module name (``transformers.integrations``): the experiment
trackers' callbacks and availability checks.

The code lives in :mod:`trainwell.compat.integrations`; importing this name gives that very module object (it takes
this module's place in ``sys.modules``), so a monkeypatch through either name reaches the code.
``trainwell.integrations.ray_train`` (Ray Train's Hugging Face helpers, :mod:`trainwell.callbacks.ray_train`) is
registered under that name here, since the module standing for this one is a file, not a package.
"""

import sys
from typing import TYPE_CHECKING

from .callbacks import ray_train as _ray_train
from .compat import integrations as _module

if TYPE_CHECKING:  # what type checkers and editors read: the names of the module this one stands for
    from .compat.integrations import *  # noqa: F403

_module.ray_train = _ray_train  # type: ignore[attr-defined]
sys.modules[__name__ + ".ray_train"] = _ray_train
sys.modules[__name__] = _module
