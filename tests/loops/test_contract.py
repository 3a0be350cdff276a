"""The loops' contract (trainwell.loops.contract) matches both sides: the Trainer has every member, and the loop
functions use no member of the trainer the Protocols do not name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell import Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer, TrainingArguments
from trainwell.loops import contract

LOOPS = Path(contract.__file__).parent


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        out = self.linear(x).squeeze(-1)
        return {"loss": ((out - labels) ** 2).mean(), "logits": out}


@pytest.mark.parametrize("trainer_cls,args_cls", [(Trainer, TrainingArguments),
                                                  (Seq2SeqTrainer, Seq2SeqTrainingArguments)])
def test_a_constructed_trainer_has_every_member_of_the_contract(tmp_path, trainer_cls, args_cls):
    args = args_cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no")
    trainer = trainer_cls(model=Tiny(), args=args)
    members = contract.protocol_members(contract.LoopTrainer)
    assert {"args", "training_step", "prediction_step", "evaluation_loop", "_past"} <= members
    missing = sorted(name for name in members if not hasattr(trainer, name))
    assert not missing, f"the loops use members {type(trainer).__name__} lacks: {missing}"
    for protocol in (contract.LoopTrainer, contract.TrainLoopTrainer, contract.EvalLoopTrainer,
                     contract.RunTrainer):
        assert isinstance(trainer, protocol), protocol.__name__
    methods = {name for name in members if callable(getattr(contract.LoopTrainer, name, None))}
    assert all(callable(getattr(trainer, name)) for name in methods)


def test_an_object_missing_a_member_does_not_satisfy_the_contract():
    class Partial:
        args = state = control = callback_handler = model = backend = optimizer = _past = None

    assert not isinstance(Partial(), contract.EvalLoopTrainer)


def _trainer_members_used(path: Path) -> dict[str, set[str]]:
    """``{"load": names, "store": names}`` of ``trainer.<name>`` in a module (attributes of a name ``trainer``)."""
    used: dict[str, set[str]] = {"load": set(), "store": set()}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
            used["store" if isinstance(node.ctx, ast.Store) else "load"].add(node.attr)
    return used


@pytest.mark.parametrize("path", sorted(LOOPS.glob("*.py")), ids=lambda p: p.name)
def test_the_loops_use_only_members_the_contract_names(path):
    members = contract.protocol_members(contract.LoopTrainer) | {"__dict__"}
    used = _trainer_members_used(path)
    unnamed = sorted((used["load"] | used["store"]) - members)
    assert not unnamed, f"{path.name} uses trainer members missing from loops/contract.py: {unnamed}"


def test_the_loop_functions_take_the_contract_not_any():
    for path in sorted(LOOPS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for arg in node.args.args + node.args.kwonlyargs:
                    if arg.arg in ("trainer", "args") and arg.annotation is not None:
                        assert ast.unparse(arg.annotation) != "Any", f"{path.name}:{node.name}({arg.arg}: Any)"


def test_run_evaluation_calls_an_overridden_prediction_step_per_batch(tmp_path):
    from trainwell.loops.eval_loop import run_evaluation

    calls = []

    class Counting(Trainer):
        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            calls.append(len(inputs["x"]))
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    data = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(5)]
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_eval_batch_size=2)
    trainer = Counting(model=Tiny(), args=args, eval_dataset=data)
    output = run_evaluation(trainer, trainer.get_eval_dataloader(), "Evaluation", model=trainer.model)
    assert calls == [2, 2, 1] and output.num_samples == 5 and output.predictions.shape == (5,)
    metrics = trainer.evaluate()
    assert calls[3:] == [2, 2, 1] and metrics["eval_loss"] == pytest.approx(output.metrics["eval_loss"])


# ------------------------------------------------------------------------ the contract holds upstream's names only
#: The private members of upstream's Trainer the loops use, as upstream's own loops do.
UPSTREAM_PRIVATE = {"_past", "_memory_tracker", "_train_batch_size", "_prepare_inputs", "_evaluate",
                    "_determine_best_metric", "_maybe_log_save_evaluate", "_load_best_model", "_rotate_checkpoints",
                    "_finish_current_push", "_get_learning_rate", "_get_dataloader", "_get_eval_sampler"}


def test_the_contract_names_only_upstreams_members():
    transformers = pytest.importorskip("transformers")
    members = contract.protocol_members(contract.LoopTrainer)
    private = {name for name in members if name.startswith("_")}
    assert private == UPSTREAM_PRIVATE  # trainwell's own parts reach the run as RunParts, not through the Trainer
    upstream = transformers.Trainer
    source = "".join(path.read_text() for path in Path(transformers.__file__).parent.glob("trainer*.py"))
    # older upstream's names (the seeds' releases), gone from the installed one; and the backend, trainwell's one
    # interface to the engines where upstream holds an Accelerator
    older = {"_past", "_rotate_checkpoints", "prediction_loop", "backend"}
    assert older <= members, sorted(older - members)  # every name listed is one of the contract's
    for name in sorted(members - older):  # upstream's: a method or class attribute, or set on the instance
        assert hasattr(upstream, name) or f"self.{name} =" in source or f"self.{name}:" in source, name
    assert len(members) == 45  # 52 before the run's parts were handed over; a new member is a decision


def _private_reads_across_modules() -> dict[str, set[str]]:
    """``{module: names}``: ``<object>.<_private>`` read in a trainwell module where the object is not ``self``/``cls``
    and the name is not defined in that module (a class's or module's own private names are its business)."""
    import trainwell

    root = Path(trainwell.__file__).parent
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        defined = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.ClassDef,
                                                                               ast.AsyncFunctionDef))}
        defined |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store)}
        defined |= {target.id for node in ast.walk(tree) if isinstance(node, (ast.Assign, ast.AnnAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                    if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                    and node.attr not in defined):
                found.setdefault(str(path.relative_to(root)), set()).add(node.attr)
    return found


def test_no_module_outside_the_trainer_reads_a_trainwell_internal_of_the_trainer():
    reads = _private_reads_across_modules()
    outside = {module: sorted(n for n in names if n.startswith("_tw_")) for module, names in reads.items()
               if not module.startswith("trainer/")}
    assert not {module: names for module, names in outside.items() if names}
    loops = set().union(*(names for module, names in reads.items() if module.startswith("loops/")))
    # the Trainer's own parts, which reach the run as RunParts (every name listed here is a member of the Trainer)
    trainer_internal = {"_flops_counter", "_count_input_tokens", "_scheduler_needs_metrics",
                        "_compute_loss_takes_num_items", "_adopt_input_dtype", "_model_for_eval"}
    assert not sorted(name for name in trainer_internal if not hasattr(Trainer, name))
    assert not loops & trainer_internal
    names = set().union(*reads.values())
    # 51 names read across modules before the run got its parts; a new one is a decision, not a drift (39th and
    # 40th: torch's group registry `_world` and `_get_default_store`, which the exit teardown reads: torch has no
    # public list of every group, nor of the rendezvous store)
    assert len(names) <= 40, sorted(names)
