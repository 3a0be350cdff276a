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
    assert {"args", "training_step", "prediction_step", "evaluation_loop", "_model_for_eval"} <= members
    missing = sorted(name for name in members if not hasattr(trainer, name))
    assert not missing, f"the loops use members {type(trainer).__name__} lacks: {missing}"
    for protocol in (contract.LoopTrainer, contract.TrainLoopTrainer, contract.EvalLoopTrainer,
                     contract.RunTrainer):
        assert isinstance(trainer, protocol), protocol.__name__
    methods = {name for name in members if callable(getattr(contract.LoopTrainer, name, None))}
    assert all(callable(getattr(trainer, name)) for name in methods)


def test_an_object_missing_a_member_does_not_satisfy_the_contract():
    class Partial:
        args = state = control = callback_handler = model = backend = optimizer = _set_past = None

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
    output = run_evaluation(trainer, trainer.get_eval_dataloader(), "Evaluation")
    assert calls == [2, 2, 1] and output.num_samples == 5 and output.predictions.shape == (5,)
    metrics = trainer.evaluate()
    assert calls[3:] == [2, 2, 1] and metrics["eval_loss"] == pytest.approx(output.metrics["eval_loss"])
