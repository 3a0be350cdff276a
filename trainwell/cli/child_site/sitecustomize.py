"""Run by Python at the start of every process a script under ``trainwell run`` launches (``trainwell run`` puts this
folder first on ``PYTHONPATH`` and sets ``TRAINWELL_PATCH_CHILDREN=1``): ``trainwell.patch_transformers()`` first,
so a script that trains in a child process (the ``trl`` command: ``trl sft ...`` runs ``trl/scripts/sft.py``
through ``accelerate launch``) trains on trainwell as the script itself would, then the ``sitecustomize`` that
Python would have run without this folder (a user's, coverage's), if any.

A child in another interpreter (no transformers, no trainwell) runs as it would. ``TRAINWELL_PATCH_CHILDREN=0`` set
before ``trainwell run`` leaves the children alone.
"""

import importlib.util
import os
import sys
from importlib.machinery import PathFinder


def _patch() -> None:
    if os.environ.get("TRAINWELL_PATCH_CHILDREN") != "1":
        return
    try:
        import trainwell
    except ImportError:
        return  # another interpreter, without trainwell
    try:
        trainwell.patch_transformers()
    except ImportError:
        return  # an interpreter without transformers: nothing to patch


def _chain() -> None:
    """Run the next ``sitecustomize`` on ``sys.path`` (the one this folder hides), as Python would have."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_patch()
_chain()
