"""``trainwell.integrations``, under upstream's module name (``transformers.integrations``): the experiment
trackers' callbacks and availability checks.

The code lives in :mod:`trainwell.compat.integrations`; importing this name gives that very module object (it takes
this module's place in ``sys.modules``), so a monkeypatch through either name reaches the code.
"""

import sys
from typing import TYPE_CHECKING

from .compat import integrations as _module

if TYPE_CHECKING:  # what type checkers and editors read: the names of the module this one stands for
    from .compat.integrations import *  # noqa: F403

sys.modules[__name__] = _module
