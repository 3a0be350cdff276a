"""``trainwell run SCRIPT [ARGS...]``: run an unmodified script written for ``transformers.Trainer`` (or for TRL,
sentence-transformers, setfit) on trainwell.

``trainwell.patch_transformers()`` is applied first, then the script runs as ``python SCRIPT ARGS...`` would run it:
as ``__main__``, with ``sys.argv == [SCRIPT, *ARGS]`` and the script's folder first on ``sys.path``.
``trainwell run -m MODULE [ARGS...]`` runs a module as ``python -m MODULE`` would. Works the same under
``python -m trainwell run ...`` and ``torchrun --nproc_per_node 2 -m trainwell run SCRIPT ...``.

The Python processes the script launches run patched too (the ``trl`` command runs its training scripts in a child
through ``accelerate launch``): ``PYTHONPATH`` starts with ``trainwell/cli/child_site``, whose ``sitecustomize``
patches each child before it runs, then runs the ``sitecustomize`` it hides, if any. ``TRAINWELL_PATCH_CHILDREN=0``
leaves the children alone.

The script's own errors show their full traceback (they are not usage errors of ``trainwell``), and the exit
status is the script's.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from ..arguments import CLIError

USAGE = """usage: trainwell run SCRIPT [ARGS...]
       trainwell run -m MODULE [ARGS...]

Run a script written for transformers.Trainer, TRL, sentence-transformers or setfit on trainwell, unmodified:
trainwell.patch_transformers() is applied first, then SCRIPT runs as `python SCRIPT ARGS...` would (as __main__,
sys.argv set to [SCRIPT, *ARGS]). The Python processes the script launches (the `trl` command's
training scripts, started through `accelerate launch`) are patched too; TRAINWELL_PATCH_CHILDREN=0 leaves them
alone. Under torchrun: torchrun --nproc_per_node 2 -m trainwell run SCRIPT ARGS...
"""


#: the folder whose ``sitecustomize`` patches the Python processes a script launches
CHILD_SITE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "child_site")
CHILD_VARS = ("PYTHONPATH", "TRAINWELL_PATCH_CHILDREN")


def _patch_children() -> dict[str, str | None]:
    """Put :data:`CHILD_SITE` first on the ``PYTHONPATH`` the script's child processes inherit (unless
    ``TRAINWELL_PATCH_CHILDREN=0``); returns the variables as they were, for :func:`_restore`."""
    saved = {name: os.environ.get(name) for name in CHILD_VARS}
    if saved["TRAINWELL_PATCH_CHILDREN"] == "0":
        return saved
    os.environ["TRAINWELL_PATCH_CHILDREN"] = "1"
    rest = [entry for entry in saved["PYTHONPATH"].split(os.pathsep) if entry != CHILD_SITE] \
        if saved["PYTHONPATH"] else []
    os.environ["PYTHONPATH"] = os.pathsep.join([CHILD_SITE, *rest])
    return saved


def _restore(saved: dict[str, str | None]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _target(argv: list[str]) -> tuple[str, str, list[str]]:
    """``("path" | "module", name, script_args)`` from the arguments after ``run``."""
    if not argv:
        raise CLIError("trainwell run needs a script: trainwell run SCRIPT [ARGS...] (see 'trainwell run --help')")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise CLIError("trainwell run -m needs a module name: trainwell run -m MODULE [ARGS...]")
        return "module", argv[1], argv[2:]
    script = argv[0]
    if not os.path.isfile(script):
        raise CLIError(f"trainwell run: script {script!r} not found; pass the path of a Python file "
                       "(or -m MODULE for a module)")
    return "path", script, argv[1:]


def run(argv: list[str]) -> int:
    """``trainwell run``: the script's exit status (0 when it returns normally, 1 on an uncaught exception)."""
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    kind, name, script_args = _target(argv)
    import trainwell  # the public name: the patch lives in trainwell.compat, above the command line

    trainwell.patch_transformers()
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    saved_env = _patch_children()
    try:
        if kind == "path":
            sys.argv = [name, *script_args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(name)))
            runpy.run_path(name, run_name="__main__")
        else:
            sys.argv = [name, *script_args]  # run_module puts the module's file name in sys.argv[0]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(name, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        raise
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        _restore(saved_env)
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path and sys.path[0] != saved_path0:
            sys.path.pop(0)
    return 0
