"""``patch_transformers()``: libraries built on ``transformers.Trainer`` (TRL, sentence-transformers, setfit) run on
trainwell.

Their trainers subclass ``transformers.Trainer`` and their configs subclass ``transformers.TrainingArguments``, looked
up when the library is imported. The patch puts trainwell's classes under those names before that happens:

* on the submodules the libraries import from (``transformers.trainer``, ``transformers.training_args``,
  ``transformers.trainer_seq2seq``, ``transformers.training_args_seq2seq``), and
* on the ``transformers`` package itself.

Why the submodules are the hook: transformers' package is a lazy module, and importing some of its submodules
(``transformers.processing_utils``, which ``transformers.trainer`` imports) re-executes its ``__init__`` and puts a
*new* module object into ``sys.modules["transformers"]``; an attribute set on the old object is silently lost. The
new lazy module resolves ``Trainer`` by reading ``transformers.trainer.Trainer`` (a submodule stays in
``sys.modules`` across the re-execution), so once the submodules carry trainwell's classes every later package
object answers with them too. The submodules are imported first (which triggers the re-execution up front), then
the package attributes are set on whatever object ``sys.modules["transformers"]`` is by then.

Which library a run serves under is printed once, before the first logged values: ``trainwell Trainer under
trl.SFTTrainer``.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import FrameType
from typing import Any

from ..callbacks.base import TrainerCallback
# The Trainer and the arguments load when the patch is applied: reading trainwell.patch_transformers loads this module.

#: libraries whose trainers or configs subclass transformers' classes at import time: imported before the patch,
#: they hold upstream's classes for good
DEPENDENT_LIBRARIES = ("trl", "sentence_transformers", "setfit")

#: transformers module -> the names trainwell replaces there (each only where the module defines it)
PATCHED_NAMES: dict[str, tuple[str, ...]] = {
    "transformers.trainer": ("Trainer", "TrainingArguments"),
    "transformers.training_args": ("TrainingArguments",),
    "transformers.trainer_seq2seq": ("Seq2SeqTrainer", "Trainer", "Seq2SeqTrainingArguments", "TrainingArguments"),
    "transformers.training_args_seq2seq": ("Seq2SeqTrainingArguments", "TrainingArguments"),
    "transformers": ("Trainer", "TrainingArguments", "Seq2SeqTrainer", "Seq2SeqTrainingArguments"),
}

#: upstream's objects replaced by the patch: ``{(module, name): object}`` (empty until the first patch)
ORIGINALS: dict[tuple[str, str], Any] = {}


def _replacements() -> dict[str, Any]:
    from ..args.fields import TrainingArguments
    from ..args.seq2seq import Seq2SeqTrainingArguments
    from ..trainer.seq2seq import Seq2SeqTrainer
    from ..trainer.trainer import Trainer

    return {"Trainer": Trainer, "TrainingArguments": TrainingArguments, "Seq2SeqTrainer": Seq2SeqTrainer,
            "Seq2SeqTrainingArguments": Seq2SeqTrainingArguments}


def is_patched() -> bool:
    """Whether ``transformers.Trainer`` currently is trainwell's (the patch was applied and still holds)."""
    module = sys.modules.get("transformers.trainer")
    return module is not None and getattr(module, "__dict__", {}).get("Trainer") is _replacements()["Trainer"]


def _check_not_too_late() -> None:
    """An error when a dependent library was imported before the patch (its classes derive from upstream's)."""
    early = [name for name in DEPENDENT_LIBRARIES if name in sys.modules]
    if early:
        raise RuntimeError(
            f"trainwell.patch_transformers() was called after {', '.join(early)} was imported, so its trainers "
            "already subclass transformers' own Trainer: call `import trainwell; trainwell.patch_transformers()` "
            "at the top of the script, before importing " + ", ".join(early) + " (or run the unmodified script "
            "with `trainwell run SCRIPT [ARGS...]`).")


def early_subclasses() -> list[str]:
    """``module.QualName`` of every class defined outside transformers that already derives (at any depth) from
    upstream's ``Trainer`` or ``TrainingArguments``: a script's or a package's class built before the patch, which
    keeps upstream's class as its base whatever the patch does. Empty when transformers' trainer was not imported."""
    roots: list[type] = []
    for module_name, name in (("transformers.trainer", "Trainer"), ("transformers.training_args", "TrainingArguments")):
        module = sys.modules.get(module_name)
        upstream = ORIGINALS.get((module_name, name), getattr(module, "__dict__", {}).get(name))
        if isinstance(upstream, type) and upstream.__module__.startswith("transformers"):
            roots.append(upstream)
    found: dict[type, None] = {}
    stack: list[type] = list(roots)
    while stack:
        subclasses: list[type] = stack.pop().__subclasses__()
        for sub in subclasses:
            if sub not in found:
                found[sub] = None
                stack.append(sub)
    return [f"{cls.__module__}.{cls.__qualname__}" for cls in found
            if cls.__module__.split(".")[0] not in ("transformers", "trainwell")]


def _warn_early_subclasses() -> None:
    """A warning naming every class :func:`early_subclasses` finds: it stays on upstream's Trainer."""
    early = early_subclasses()
    if early:
        warnings.warn(
            f"trainwell.patch_transformers(): {len(early)} class(es) were defined before the patch and subclass "
            f"transformers' own Trainer/TrainingArguments, so they run on upstream, not trainwell: {', '.join(early)}. "
            "Call `import trainwell; trainwell.patch_transformers()` at the top of the script, before importing the "
            "packages that define them and before defining them (or run the script with `trainwell run SCRIPT`).",
            UserWarning, stacklevel=3)


def patch_transformers() -> None:
    """Make ``transformers.Trainer``, ``TrainingArguments``, ``Seq2SeqTrainer`` and ``Seq2SeqTrainingArguments``
    trainwell's, everywhere libraries look them up; call it before importing TRL, sentence-transformers or setfit.

    Idempotent. Raises ``ImportError`` when transformers is not installed and ``RuntimeError`` when a library
    that subclasses the Trainer was imported first; warns (``UserWarning``) naming every other class defined before
    the call that subclasses upstream's ``Trainer`` or ``TrainingArguments`` (a script's own, another package's).
    """
    try:
        importlib.import_module("transformers")
    except ImportError:
        raise ImportError("trainwell.patch_transformers() needs the transformers package, which is not installed: "
                          "pip install transformers (plain trainwell scripts need no patch)") from None
    if is_patched():
        _set_names()  # the package object may have been replaced since: set its names again
        return
    _check_not_too_late()
    _warn_early_subclasses()
    for module_name in PATCHED_NAMES:  # the submodules first: importing them may replace the package object
        importlib.import_module(module_name)
    _set_names()
    _announce_serving_library()


def _set_names() -> None:
    """Put trainwell's classes on every module of ``PATCHED_NAMES`` (remembering upstream's in ``ORIGINALS``)."""
    replacements = _replacements()
    for module_name, names in PATCHED_NAMES.items():
        module = sys.modules[module_name]
        for name in names:
            if module_name != "transformers" and name not in module.__dict__:
                continue
            current = getattr(module, name)
            if current is not replacements[name]:
                ORIGINALS.setdefault((module_name, name), current)
                setattr(module, name, replacements[name])


def _announce_serving_library() -> None:
    """Every Trainer built from now on prints which library class it serves under, before its first log."""
    from ..trainer import trainer as trainer_module

    if ServingLibraryCallback not in trainer_module.DEFAULT_CALLBACKS:
        trainer_module.DEFAULT_CALLBACKS.append(ServingLibraryCallback)


def serving_library_name(trainer_class: type) -> str:
    """``"trl.SFTTrainer"``: the most derived class of ``trainer_class`` defined by a library (not by trainwell nor
    by the running script), as ``<top-level package>.<class name>``; ``"transformers.Trainer"`` when none is."""
    for cls in trainer_class.__mro__:
        top = cls.__module__.split(".")[0]
        if top not in ("trainwell", "__main__", "builtins", "__mp_main__"):
            return f"{top}.{cls.__name__}"
    return "transformers.Trainer"


def _calling_trainer() -> Any:
    """The Trainer whose ``log`` is on the call stack (a callback is not handed the trainer itself)."""
    from ..trainer.trainer import Trainer

    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainer):
            return candidate
        frame = frame.f_back
    return None


class ServingLibraryCallback(TrainerCallback):
    """Prints ``trainwell Trainer under <library class>`` once per trainer, before its first logged values
    (on the main process). Added to every Trainer's default callbacks by :func:`patch_transformers`."""

    def __init__(self) -> None:
        self.announced = False

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.announced:
            return
        self.announced = True
        trainer = _calling_trainer()
        if trainer is not None and state.is_world_process_zero:
            print(f"trainwell Trainer under {serving_library_name(type(trainer))}", flush=True)
