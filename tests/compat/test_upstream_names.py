"""Every trainer-side name upstream exports is importable from trainwell, or listed in :data:`NOT_PROVIDED` with why.

Read from the installed ``transformers`` at test time, so a new release shows each new name as a failing test.

Which names are *trainer-side* is decided by the module that defines them:

* the top-level ``transformers`` names whose defining module (the package's lazy import table,
  ``transformers._class_to_module``) is one of :data:`TRAINER_MODULES`: the Trainer and its arguments
  (``trainer*``, ``training_args*``), callbacks, ``trainer_utils``, ``trainer_pt_utils``, ``optimization``,
  ``data.data_collator``, ``hf_argparser``, and ``integrations`` itself (its top-level names are the trackers' and
  hyperparameter-search backends' ``is_*_available``; its submodules, model-side kernels and exporters, are not);
  models, tokenizers, pipelines, generation, quantization and the general ``utils`` are model-side;
* every public name *defined* in ``transformers.trainer_utils``, ``trainer_callback``, ``optimization`` and
  ``data.data_collator`` (read from the module's source: its top-level ``def``, ``class`` and assignments, also those
  under ``if``/``try``; not the names it imports, not ``_private`` ones, not its ``logger``).

A name is provided when ``trainwell`` has it at the top level, or the trainwell module that mirrors upstream's
module name has it (:data:`MIRRORS`: ``trainwell.trainer_utils``, ``trainwell.integrations``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect

import pytest

import trainwell

transformers = pytest.importorskip("transformers")

TRAINER_MODULES = ("trainer", "trainer_seq2seq", "training_args", "training_args_seq2seq", "trainer_callback",
                   "trainer_utils", "trainer_pt_utils", "optimization", "data.data_collator", "hf_argparser",
                   "integrations")
MODULES = ("trainer_utils", "trainer_callback", "optimization", "data.data_collator")
MIRRORS = {"trainer_utils": "trainwell.trainer_utils", "integrations": "trainwell.integrations"}

#: name -> why trainwell does not provide it (one table for every module above)
NOT_PROVIDED: dict[str, str] = {
    # trainer_utils
    "align_special_tokens": "aligns a transformers model's config and generation config with a tokenizer's "
                            "special tokens: model-side (transformers' PreTrainedModel)",
    "check_target_module_exists": "matches PEFT-style module names for upstream's optim_target_modules (GaLore, "
                                  "APOLLO); trainwell selects those parameters in optim/extras.py",
    "compare_trainer_and_checkpoint_args": "warns when a resumed run's batch size or logging steps differ from the "
                                           "checkpoint's; trainwell's resume restores or refuses (checkpoint/)",
    "default_hp_space_wandb": "the W&B sweeps hyperparameter-search backend is not provided (optuna and ray are)",
    "find_executable_batch_size": "accelerate's decorator; trainwell's auto_find_batch_size is the loop of "
                                  "loops/batch_size.py, not a decorator",
    "is_main_process": "upstream's is_main_process(local_rank) helper; use TrainingArguments.is_main_process",
    "load_sharded_checkpoint": "loads transformers' sharded model files into a model: model-side "
                               "(transformers.modeling_utils); trainwell's weights loading is checkpoint/weights.py",
    "number_of_arguments": "a helper of upstream's find_executable_batch_size (see there)",
    "rotate_checkpoints": "trainwell rotates only the committed checkpoints it created (checkpoint/rotation.py), "
                          "with the run's lock; a free function deleting folders by name is not offered",
    "sort_checkpoints": "see rotate_checkpoints; trainwell orders committed checkpoints in checkpoint/layout.py",
    "suppress_progress_bars": "silences transformers' and datasets' hub progress bars (a transformers logging "
                              "setting): trainwell shows no hub progress bars of its own",
    "total_processes_number": "a helper of upstream's ray hyperparameter search for its local process count",
    "unwrap_peft_model": "peft's PeftModel.get_base_model(); trainwell unwraps in utils/model_utils.py",
    "validate_quantization_for_training": "checks a transformers quantized model (hf_quantizer) before training: "
                                          "model-side",
    # trainer_pt_utils (top level)
    "torch_distributed_zero_first": "use TrainingArguments.main_process_first(local=True), the same barrier",
    # data.data_collator
    "DataCollatorMixin": "the return_tensors dispatch base of upstream's collators; trainwell's collators are "
                         "dataclasses with __call__ (TRL subclasses upstream's, which stays importable from "
                         "transformers)",
    "DataCollatorForPermutationLanguageModeling": "XLNet's permutation LM objective only",
    "InputDataClass": "a typing alias (NewType over Any) of upstream's collator signatures",
    "numpy_default_data_collator": "default_data_collator(features, return_tensors='np')",
    "torch_default_data_collator": "default_data_collator(features, return_tensors='pt')",
    "to_numpy": "a helper of upstream's numpy collators",
    "pad_without_fast_tokenizer_warning": "silences a transformers tokenizer warning around tokenizer.pad; "
                                          "trainwell's collators call tokenizer.pad directly",
}


@functools.cache
def _defined_names(module_name: str) -> frozenset[str]:
    """The public top-level names ``transformers.<module_name>``'s source defines (see the module doc)."""
    module = importlib.import_module(f"transformers.{module_name}")
    names: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try)):
                walk(node.body)
                walk(node.orelse)
                for handler in getattr(node, "handlers", []):
                    walk(handler.body)
                walk(getattr(node, "finalbody", []))

    walk(ast.parse(inspect.getsource(module)).body)
    return frozenset(name for name in names if not name.startswith("_") and name != "logger")


def _top_level_names() -> dict[str, str]:
    """Upstream's trainer-side top-level names: ``{name: defining module}``."""
    table = getattr(transformers, "_class_to_module", None)
    assert isinstance(table, dict), "transformers no longer has its lazy import table `_class_to_module`: " \
                                    "update _top_level_names to the new way of listing the package's names"
    return {name: module for name, module in table.items() if module in TRAINER_MODULES}


def upstream_names() -> dict[str, str]:
    """Every trainer-side name: ``{name: the upstream module it is listed under}``."""
    names = {name: module for module in MODULES for name in _defined_names(module)}
    names.update(_top_level_names())  # a top-level name counts under its defining module as well
    return names


def provided(name: str, module: str) -> bool:
    """Whether ``name`` imports from ``trainwell`` or from the mirror of ``module``."""
    if hasattr(trainwell, name):
        return True
    mirror = MIRRORS.get(module)
    return mirror is not None and hasattr(importlib.import_module(mirror), name)


def test_every_trainer_side_name_is_provided_or_listed():
    names = upstream_names()
    missing = sorted(f"{module}.{name}" for name, module in names.items()
                     if not provided(name, module) and name not in NOT_PROVIDED)
    assert not missing, f"upstream names neither in trainwell nor in NOT_PROVIDED: {missing}"


def test_the_table_lists_only_upstream_names_trainwell_lacks():
    names = upstream_names()
    stale = sorted(name for name in NOT_PROVIDED if name not in names)
    assert not stale, f"NOT_PROVIDED lists names upstream no longer has: {stale}"
    now_provided = sorted(name for name in NOT_PROVIDED if provided(name, names[name]))
    assert not now_provided, f"NOT_PROVIDED lists names trainwell provides: {now_provided}"


def test_the_counts():
    """The counts the README quotes (transformers 5.24): a change upstream changes them, on purpose."""
    names = upstream_names()
    counts = {module: len(_defined_names(module)) for module in MODULES}
    counts["top level"] = len(_top_level_names())
    provided_count = sum(provided(name, module) for name, module in names.items())
    assert provided_count + len(NOT_PROVIDED) == len(names)
    print(f"\ntrainer-side names: {len(names)} ({counts}); provided {provided_count}, not provided "
          f"{len(NOT_PROVIDED)}")


# ------------------------------------------------------------------------------------------------ signatures
#: checked elsewhere: every field of the arguments (tests/args), the Trainer's methods (tests/compat)
SIGNATURES_CHECKED_ELSEWHERE = ("TrainingArguments", "Seq2SeqTrainingArguments", "Trainer", "Seq2SeqTrainer")

#: "name.parameter" -> why trainwell's signature differs there
SIGNATURE_DIFFERENCES: dict[str, str] = {
    "DataCollatorForLanguageModeling.whole_word_mask": "whole-word masking (5.x) needs a fast tokenizer's word "
                                                       "ids; trainwell masks single tokens",
    "TrainerState.log_history": "a default_factory list: upstream's default None becomes [] in __post_init__, "
                                "the same empty list",
}


def _upstream_object(name: str, module: str) -> object:
    found = getattr(importlib.import_module(f"transformers.{module}"), name, None)
    return found if found is not None else getattr(transformers, name)


def _our_object(name: str, module: str) -> object:
    if hasattr(trainwell, name):
        return getattr(trainwell, name)
    return getattr(importlib.import_module(MIRRORS[module]), name)


def _signature_differences(up: object, ours: object) -> list[str]:
    """Upstream's named parameters that ``ours`` lacks, takes in another position, or defaults differently."""
    try:
        theirs, mine = inspect.signature(up), inspect.signature(ours)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # an alias such as DataCollator = Callable[...]: no signature
        return []
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in mine.parameters.values()):
        return []  # ours forwards what it is given
    named = [p for p in theirs.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    positional = [p.name for p in mine.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems, skipped = [], 0
    for index, param in enumerate(named):
        other = mine.parameters.get(param.name)
        if other is None:
            problems.append(f"{param.name} (missing)")
            skipped += 1  # (the parameters after it are compared one position earlier)
        elif param.kind == param.POSITIONAL_OR_KEYWORD and positional[index - skipped:][:1] != [param.name]:
            problems.append(f"{param.name} (not at position {index})")
        elif param.default is not param.empty and repr(other.default) != repr(param.default):
            problems.append(f"{param.name} (default {other.default!r}, upstream {param.default!r})")
    return problems


def test_provided_names_take_upstreams_arguments():
    """Each provided function or class takes upstream's parameters, in upstream's positions, with upstream's
    defaults (a call written for upstream works unchanged), except where :data:`SIGNATURE_DIFFERENCES` says."""
    names = upstream_names()
    wrong = []
    for name, module in sorted(names.items()):
        if name in SIGNATURES_CHECKED_ELSEWHERE or not provided(name, module):
            continue
        up, ours = _upstream_object(name, module), _our_object(name, module)
        if callable(up) and callable(ours):
            wrong += [f"{name}.{problem}" for problem in _signature_differences(up, ours)
                      if f"{name}.{problem.split()[0]}" not in SIGNATURE_DIFFERENCES]
    assert not wrong, f"signatures that differ from upstream's: {wrong}"


def test_an_evaluation_before_training_logs_epoch_0_as_upstream(tmp_path):
    """``TrainerState.epoch`` defaults to 0 as upstream's (it was None): ``evaluate()`` before ``train()`` logs
    ``epoch: 0``, which the trackers and ``log_history`` readers see."""
    import torch
    from torch import nn

    class Regressor(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(2, 1)

        def forward(self, x, labels=None):
            return {"loss": ((self.linear(x).squeeze(-1) - labels) ** 2).mean()}

    rows = [{"x": torch.ones(2), "labels": torch.tensor(1.0)}] * 4
    logged = []
    for lib in (trainwell, transformers):
        args = lib.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True)
        trainer = lib.Trainer(model=Regressor(), args=args, eval_dataset=rows)
        assert trainer.state.epoch == 0 and lib.TrainerState().epoch == 0
        trainer.evaluate()
        logged.append((trainer.state.log_history[-1]["epoch"], trainer.state.log_history[-1]["step"]))
    assert logged == [(0, 0), (0, 0)]
