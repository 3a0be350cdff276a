"""``trainwell.debug_utils``, under upstream's module name (``transformers.debug_utils``): the underflow/overflow
detector and the debug options.

The code lives in :mod:`trainwell.compat.debug_utils`; importing this name gives that very module object (it takes
this module's place in ``sys.modules``), so a monkeypatch through either name reaches the code.
"""

import sys
from typing import TYPE_CHECKING

from .compat import debug_utils as _module

if TYPE_CHECKING:  # what type checkers and editors read: the names of the module this one stands for
    from .compat.debug_utils import *  # noqa: F403

sys.modules[__name__] = _module
