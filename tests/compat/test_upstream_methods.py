"""Every method of upstream's ``Trainer`` that TRL, sentence-transformers, setfit or PEFT calls or overrides exists on
trainwell's ``Trainer`` with a compatible signature, found by reading the installed libraries' source at test time
(tests/compat/upstream_surface.py), so a new release of any of them shows a gap as a failing test.

Compatible: every call upstream's signature accepts (each positional count, every keyword it names) binds to
trainwell's, every call the library writes binds too, and the defaults are upstream's. What trainwell lacks on purpose
is in ``DELIBERATELY_MISSING`` with the reason; nothing is skipped silently (a stale entry fails too).

Counts with trl 1.16, sentence-transformers 6.2, setfit 1.2, peft 0.21 and transformers 5.24: 31 Trainer classes,
41 upstream method names used (41 found, 40 checked, 1 in the table).
"""

from __future__ import annotations

import importlib.util
import inspect
from typing import Any

import pytest
import torch

import trainwell

transformers = pytest.importorskip("transformers")

from upstream_surface import trainer_classes, trainer_uses  # noqa: E402

pytestmark = pytest.mark.slow  # imports the four libraries and reads their source: 5 to 20 s

LIBRARIES = tuple(name for name in ("trl", "sentence_transformers", "setfit", "peft")
                  if importlib.util.find_spec(name) is not None)

#: upstream method name -> why trainwell's Trainer has none
DELIBERATELY_MISSING = {
    "_inner_training_loop": "trainwell's loop is the run object of trainwell/loops (train_loop.py), not a Trainer "
                            "method; TRL's experimental async trainers (AsyncGRPO, AsyncDistillation) wrap it, and "
                            "those are not supported",
}

#: upstream method name -> parameter -> why trainwell's default differs
DEFAULT_DIFFERENCES: dict[str, dict[str, str]] = {}


def upstream_methods() -> set[str]:
    """The names on ``transformers.Trainer`` that are functions (methods, static and class methods)."""
    names = set()
    for name in dir(transformers.Trainer):
        raw = inspect.getattr_static(transformers.Trainer, name)
        if inspect.isfunction(raw) or isinstance(raw, (staticmethod, classmethod)):
            names.add(name)
    return names


@pytest.fixture(scope="module")
def uses() -> dict[str, Any]:
    if not LIBRARIES:
        pytest.skip("none of trl, sentence-transformers, setfit, peft is installed")
    return trainer_uses(LIBRARIES, upstream_methods())


def _call_shapes(signature: inspect.Signature) -> list[tuple[int, tuple[str, ...]]]:
    """The calls ``signature`` accepts, as (positional count, keyword names): each positional count from the
    required ones to all, with the other named parameters as keywords (all of them, and none of the optional)."""
    params = [p for p in signature.parameters.values() if p.name != "self"]
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_pos = sum(p.default is p.empty for p in positional)
    shapes = []
    for count in range(required_pos, len(positional) + 1):
        rest = [p for p in params[count:] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        shapes.append((count, tuple(p.name for p in rest)))
        shapes.append((count, tuple(p.name for p in rest if p.default is p.empty)))
    return shapes


def _binds(signature: inspect.Signature, shape: tuple[int, tuple[str, ...]]) -> bool:
    count, keywords = shape
    try:
        signature.bind(None, *range(count), **{k: None for k in keywords})  # None stands for self
    except TypeError:
        return False
    return True


def incompatibilities(name: str, calls: list[tuple[int, tuple[str, ...]]]) -> list[str]:
    """What keeps trainwell's ``name`` from taking upstream's calls (and the library's), and default differences."""
    theirs = inspect.signature(inspect.getattr_static(transformers.Trainer, name).__get__(None, object)
                               if False else getattr(transformers.Trainer, name))
    ours = inspect.signature(getattr(trainwell.Trainer, name))
    problems = [f"{name}{theirs} call {shape} fails on trainwell's {name}{ours}"
                for shape in _call_shapes(theirs) if _binds(theirs, shape) and not _binds(ours, shape)]
    problems += [f"the library's call {name}{shape} fails on trainwell's {name}{ours}"
                 for shape in calls if _binds(theirs, shape) and not _binds(ours, shape)]
    known = DEFAULT_DIFFERENCES.get(name, {})
    for param in theirs.parameters.values():
        mine = ours.parameters.get(param.name)
        if (mine is not None and param.default is not param.empty and mine.default is not mine.empty
                and param.name not in known and not _same(param.default, mine.default)):
            problems.append(f"{name}({param.name}=...): default {mine.default!r}, upstream {param.default!r}")
    return problems


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) or str(a) == str(b)  # enums: upstream's and trainwell's members compare by value
    except Exception:
        return a is b


def test_the_libraries_trainer_classes_are_found():
    """The walk finds the trainers a user knows (a walk finding nothing would make the other tests vacuous)."""
    if not LIBRARIES:
        pytest.skip("none of trl, sentence-transformers, setfit, peft is installed")
    found = {name.rsplit(".", 1)[1] for name in trainer_classes(LIBRARIES)}
    expected = {"trl": {"SFTTrainer", "DPOTrainer", "GRPOTrainer", "RewardTrainer"},
                "sentence_transformers": {"SentenceTransformerTrainer", "CrossEncoderTrainer"}}
    for library, names in expected.items():
        if library in LIBRARIES:
            assert names <= found, sorted(found)


def test_every_method_the_libraries_use_exists_on_trainwell(uses):
    missing = sorted(name for name in uses if not hasattr(trainwell.Trainer, name))
    unexplained = [f"{name} ({', '.join(sorted(uses[name].how))} in {', '.join(sorted(uses[name].where)[:3])})"
                   for name in missing if name not in DELIBERATELY_MISSING]
    assert not unexplained, "upstream Trainer methods the libraries use, missing from trainwell: " + "; ".join(
        unexplained)


def test_the_table_of_missing_methods_is_current(uses):
    """Each entry is still used by a library and still missing (a stale entry would hide a future gap)."""
    for name in DELIBERATELY_MISSING:
        assert name in uses, f"{name} is no longer used by {LIBRARIES}: remove it from DELIBERATELY_MISSING"
        assert not hasattr(trainwell.Trainer, name), f"trainwell has {name} now: remove it from the table"


def test_every_used_method_has_a_compatible_signature(uses):
    problems = []
    for name in sorted(uses):
        if hasattr(trainwell.Trainer, name):
            problems += incompatibilities(name, uses[name].calls)
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------- upstream's whole method list
#: methods of upstream's Trainer (or its bases) that trainwell's Trainer does not have, each with why: upstream's
#: internals whose job trainwell does elsewhere or not at all; a method upstream adds in a new release fails
#: test_every_upstream_trainer_method_exists_on_trainwell until it is added or listed here
NOT_ON_TRAINWELL = {
    **DELIBERATELY_MISSING,
    # the training loop's internals: trainwell's loop is the run object of trainwell/loops (train_loop.py)
    "_run_epoch": "one epoch of upstream's _inner_training_loop; trainwell/loops/train_loop.py runs the epochs",
    "_init_training_state": "sets up upstream's loop state; trainwell/loops/loop_state.py",
    "_prepare_for_training": "upstream's loop set-up (optimizer, wrapping, resume); the run object does it",
    "_finalize_training": "upstream's end of the loop (best model, metrics); trainwell/loops/train_loop.py",
    "set_initial_training_values": "upstream's epoch and step counts; trainwell/loops computes them (epoch sizing)",
    "get_total_train_batch_size": "upstream's helper for its loop's counts; the run object holds the total batch",
    "get_batch_samples": "upstream's prefetch of the accumulation window's batches (num_items_in_batch); "
                         "trainwell/loops counts the items of the window itself",
    "_get_num_items_in_batch": "the count behind get_batch_samples; done by trainwell/loops",
    "_track_num_input_tokens": "include_num_input_tokens_seen's counting inside upstream's loop; trainwell/loops",
    "_update_auto_batch_size": "auto_find_batch_size's retry bookkeeping in upstream's loop; trainwell/loops",
    "_hp_search_setup": "applies a trial's values to upstream's arguments; trainwell/hpsearch/trials.py",
    "_report_to_hp_search": "reports to optuna/ray from upstream's loop; trainwell/hpsearch",
    "_tune_save_checkpoint": "ray tune's checkpoint from upstream's loop; trainwell/hpsearch",
    # gradients and clipping: trainwell's backends (trainwell/backends) own the step
    "_clip_grad_norm": "upstream's clipping through the Accelerator; the backend clips (backends/)",
    "_get_grad_norm": "reads the norm from upstream's clipping; the backend returns it",
    "_defer_fsdp_gradient_reduction": "upstream's FSDP2 no-sync within accumulation; the FSDP backend does it",
    "_has_mixed_mesh_grads": "tensor/context parallel meshes, which trainwell does not run",
    "_mixed_mesh_grad_norm": "tensor/context parallel meshes, which trainwell does not run",
    "_sync_replicated_trainable_parameters": "tensor parallel replicas, which trainwell does not run",
    "_prepare_context_parallel_inputs": "context parallelism, which trainwell does not run",
    "get_cp_size": "context parallelism, which trainwell does not run (parallelism_config refuses cp_size > 1)",
    "get_sp_size": "sequence parallelism, which trainwell does not run (parallelism_config refuses sp_size > 1)",
    # accelerate and device set-up: trainwell has no Accelerator (trainer/accelerator.py answers its calls)
    "create_accelerator_and_postprocess": "builds upstream's accelerate.Accelerator; trainwell has none",
    "_build_accelerator_args": "the Accelerator's arguments; trainwell has no Accelerator",
    "_wrap_model": "DDP/FSDP/DataParallel wrapping; the backend wraps the model (backends/)",
    "_move_model_to_device": "the backend places the model (backends/)",
    "_validate_args": "upstream's Trainer-time checks; trainwell's arguments check themselves (args/validate.py) "
                      "and the Trainer's own (trainer/init_checks.py)",
    # checkpoint files: trainwell/checkpoint writes and reads them (its own layout, upstream's names)
    "_save_rng_state": "trainwell/checkpoint saves the RNG states",
    "_save_scaler": "trainwell/checkpoint saves the loss scaler",
    "_load_scaler": "trainwell/checkpoint restores the loss scaler",
    "_load_callback_state": "trainwell/checkpoint restores the callbacks' state",
    "_issue_warnings_after_load": "warns on missing/unexpected keys after upstream's load; trainwell/checkpoint "
                                  "reports them when it loads",
}


def all_upstream_methods() -> set[str]:
    """Every callable defined on ``transformers.Trainer`` or its bases other than ``object`` (functions, static and
    class methods), bar the ``__dunder__`` ones."""
    names = set()
    for klass in transformers.Trainer.__mro__:
        if klass is object:
            continue
        for name, raw in vars(klass).items():
            if not name.startswith("__") and (callable(raw) or isinstance(raw, (staticmethod, classmethod))):
                names.add(name)
    return names


def test_every_upstream_trainer_method_exists_on_trainwell():
    missing = sorted(name for name in all_upstream_methods()
                     if not callable(getattr(trainwell.Trainer, name, None)) and name not in NOT_ON_TRAINWELL)
    assert not missing, "upstream Trainer methods missing from trainwell (add them, or list them in " \
                        "NOT_ON_TRAINWELL with why): " + ", ".join(missing)


def test_the_list_of_methods_not_on_trainwell_is_current():
    """Each entry is still upstream's and still missing here (a stale entry would hide a future gap)."""
    upstream = all_upstream_methods()
    stale = [name for name in NOT_ON_TRAINWELL if name not in upstream or hasattr(trainwell.Trainer, name)]
    assert not stale, f"remove from NOT_ON_TRAINWELL: {stale}"


def test_end_closes_the_process_group_as_upstream(tmp_path):
    """``Trainer.end()`` (upstream 5.18+, last in TRL's scripts) destroys the default process group; without one it
    does nothing, as upstream's."""
    import torch.distributed as dist

    model = torch.nn.Linear(2, 1)
    kwargs = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert list(inspect.signature(trainwell.Trainer.end).parameters) == ["self"]  # upstream: end(self)
    trainwell.Trainer(model, trainwell.TrainingArguments(**kwargs)).end()  # one process: nothing to close
    trainer = trainwell.Trainer(model, trainwell.TrainingArguments(**kwargs))
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        trainer.end()
        assert not dist.is_initialized()
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        transformers.Trainer(model, transformers.TrainingArguments(**kwargs)).end()  # the oracle does the same
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
