"""``trainwell.trainer_utils``, under upstream's module name (``transformers.trainer_utils``): the enums, outputs
and helpers.

The code lives in :mod:`trainwell.compat.trainer_utils`; importing this name gives that very module object (it takes
this module's place in ``sys.modules``), so a monkeypatch through either name reaches the code.
"""

import sys
from typing import TYPE_CHECKING

from .compat import trainer_utils as _module

if TYPE_CHECKING:  # what type checkers and editors read: the names of the module this one stands for
    from .compat.trainer_utils import *  # noqa: F403
    from .compat.trainer_utils import __getattr__ as __getattr__

sys.modules[__name__] = _module
