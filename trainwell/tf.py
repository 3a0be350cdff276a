"""``trainwell.tf``: the TensorFlow trainer (upstream's ``TFTrainer`` and ``TFTrainingArguments``), the import path
README documents.

The code lives in :mod:`trainwell.compat.tf`; importing this name gives that very module object (it takes
this module's place in ``sys.modules``), so a monkeypatch through either name reaches the code.
"""

import sys
from typing import TYPE_CHECKING

from .compat import tf as _module

if TYPE_CHECKING:  # what type checkers and editors read: the names of the module this one stands for
    from .compat.tf import *  # noqa: F403
    from .compat.tf import __getattr__ as __getattr__

sys.modules[__name__] = _module
