"""Keep an optional engine the run never loaded out of upstream's save path.

transformers' ``save_pretrained`` unwraps the model through accelerate's ``extract_model_from_parallel``, which
imports DeepSpeed whenever the package is installed, only to test ``isinstance(model, DeepSpeedEngine)``: about
5 s of imports inside the first checkpoint of a run that never uses DeepSpeed (and DeepSpeed's accelerator probe
and log lines with it). No object can be a ``DeepSpeedEngine`` while the ``deepspeed`` module has never been
imported, so during a save accelerate's ``is_deepspeed_available`` is answered as "imported and installed": exact
for every model, and a run that does use DeepSpeed (which imported it long before its first save) sees no change.

This module imports nothing beyond the standard library; it patches accelerate only when accelerate is already
imported, and only for the duration of the block.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_ACCELERATE_OTHER = "accelerate.utils.other"  # the module whose extract_model_from_parallel reads the name
_lock = threading.Lock()
_depth = 0
_original: Callable[[], bool] | None = None


def _imported_and_available() -> bool:
    """accelerate's ``is_deepspeed_available``, False while ``deepspeed`` is not imported (see the module)."""
    return "deepspeed" in sys.modules and _original is not None and bool(_original())


@contextmanager
def deepspeed_stays_unimported() -> Iterator[None]:
    """Within the block, accelerate's unwrap does not import DeepSpeed unless something already did.

    Re-entrant and thread-safe (the async saver's thread): the first block in patches accelerate's name, the last
    one out restores it.
    """
    global _depth, _original
    with _lock:
        module = sys.modules.get(_ACCELERATE_OTHER)
        if _depth == 0:
            current = getattr(module, "is_deepspeed_available", None)
            if current is None or "deepspeed" in sys.modules:
                module = None  # nothing to guard: accelerate not imported yet, or DeepSpeed already loaded
            else:
                _original = current
                setattr(module, "is_deepspeed_available", _imported_and_available)
        if module is not None:
            _depth += 1
    try:
        yield
    finally:
        if module is not None:
            with _lock:
                _depth -= 1
                if _depth == 0:
                    if getattr(module, "is_deepspeed_available", None) is _imported_and_available:
                        setattr(module, "is_deepspeed_available", _original)
                    _original = None
