"""Guards on what the Trainer costs beyond a hand-written loop, in measures a busy machine cannot move.

* Python bytecodes per optimizer step, counted with ``bench/overhead.py``'s tracer (the difference of a short and a
  twice-as-long run, so set-up costs cancel): deterministic, unlike a timing. The hand loop is the same MLP, data,
  optimizer, schedule and clipping written out in plain PyTorch; both end on bit-identical weights.
* The modules ``from trainwell import Trainer, TrainingArguments`` loads after ``import torch``: the import time a
  user pays, as a count and as a list of modules that must stay out (loaded where they are used).

When a change trips a guard, ``python bench/overhead.py --opcodes`` shows the functions where the bytecodes went.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# Measured with torch 2.13 (CPU): hand loop 8613 bytecodes per step, trainwell 8720 (+1.2%), both with upstream's two
# parameter groups (weights, biases), which the Trainer's optimizer keeps because users index them (with one group
# in the hand loop, 8164: the second group is about 420 bytecodes of torch's optimizer and schedule). Before the step
# became one StepRunner (closures, a copied fast path) and the backend's precision branches a disabled GradScaler,
# trainwell ran 8563 (-0.6%): the readable step costs about 150 bytecodes per step (see docs/performance.md).
MAX_EXTRA_BYTECODES = 0.02
# Measured: 36 trainwell modules (49 before the loops, optimizer, schedules, collators and checkpoint files were loaded
# where used; 66 before the integrations, checkpoint I/O and samplers were); 39 with TrainingArguments' two bases
# (args/validate.py, args/runtime.py, split out of args/fields.py) and the one table of trackers
# (utils/tracker_table.py); 42 with utils/trainer_utils.py split into the modules named for what it held
# (option_enums, outputs, seeding, checkpoint_names: under a millisecond more by -X importtime); 44 with the
# Trainer's parts split out of trainer/trainer.py (inputs.py, run_fields.py, eval_model.py, loops/best_metric.py;
# loops/train_hooks.py now loads with the first train()).
# 50: + args.field_types (the mixins' typed base), trainer.checkpointing.checkpoint_store (checkpoint_store),
# trainer.checkpointing.preemption_report and trainer.checkpointing.resume_arguments (the checkpoint part's
# messages), each small (named by their modules' paths of today).
# 51: + trainer.checkpointing, the package the checkpoint policy's modules moved into (an __init__ of one docstring).
# 52: + loops.remainder_cut, split out of loops/eval_loop.py (the last batch's repeated rows, distributed evaluation).
MAX_TRAINER_IMPORT_MODULES = 52  # + args.data_options (the 5.24 fields) and utils.secrets (credentials kept out of checkpoints)
# Loaded where they are used, never by the import: the reporting integrations, checkpoint I/O and files, samplers,
# collators, the training loop and its loss scaling, the optimizer and schedules, the backends, the opt-in callbacks.
DEFERRED_MODULES = (
    "trainwell.callbacks.integrations.tensorboard", "trainwell.callbacks.integrations.wandb",
    "trainwell.callbacks.integrations.mlflow", "trainwell.callbacks.integrations.hosted",
    "trainwell.checkpoint.async_save", "trainwell.checkpoint.lock", "trainwell.checkpoint.preemption",
    "trainwell.checkpoint.weights", "trainwell.checkpoint.layout", "trainwell.checkpoint.manager",
    "trainwell.data.samplers", "trainwell.data.length_check", "trainwell.data.collators", "trainwell.data.columns",
    "trainwell.loops.train_loop", "trainwell.loops.loss_scaling", "trainwell.loops.loop_state",
    "trainwell.optim.factory", "trainwell.optim.schedules", "trainwell.backends.registry",
    "trainwell.runtime.distributed", "trainwell.runtime.accelerate_env", "trainwell.runtime.memory",
    "trainwell.callbacks.early_stopping", "trainwell.callbacks.divergence",
)


def _bench():
    """bench/overhead.py as a module (registered once: its dataclasses need their module in sys.modules)."""
    name = "trainwell_bench_overhead"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "bench" / "overhead.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_trainer_trains_the_hand_loop_bit_for_bit():
    """The guard below compares equal work: the Trainer and the hand loop end on identical weights and loss."""
    bench = _bench()
    cfg = bench.BenchConfig(steps=6, warmup_steps=2)
    data = bench.ToyDataset(256, cfg.seed)
    (_, hand_loss, hand), (_, our_loss, ours) = (bench.timed(runner, cfg, data)
                                                 for runner in (bench.run_hand, bench.run_trainwell))
    assert our_loss == hand_loss
    for (name, a), b in zip(hand.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_train_step_bytecodes_within_margin_of_the_hand_loop():
    """Counted in a fresh interpreter: state an earlier test leaves in torch or the process (after the whole suite:
    +63 bytecodes for the hand loop, +113 for the Trainer) must not move the measure."""
    code = ("import json, sys, importlib.util; spec = importlib.util.spec_from_file_location('b', sys.argv[1]); "
            "b = importlib.util.module_from_spec(spec); sys.modules['b'] = b; spec.loader.exec_module(b); "
            "data = b.ToyDataset(256, 0); "
            "print(json.dumps([sum(b.count_opcodes(r, data, steps=3).values()) for r in (b.run_hand, b.run_trainwell)]))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "bench" / "overhead.py")], capture_output=True,
                         text=True, check=True, timeout=300, env=env).stdout
    hand, ours = json.loads(out.strip().splitlines()[-1])
    assert hand > 1000  # the tracer saw the optimizer's Python code (not a vacuous comparison)
    assert ours <= hand * (1 + MAX_EXTRA_BYTECODES), (
        f"Trainer.train() runs {ours:.0f} Python bytecodes per optimizer step, the hand loop {hand:.0f} "
        f"(+{ours / hand - 1:.1%}, allowed +{MAX_EXTRA_BYTECODES:.0%}); see python bench/overhead.py --opcodes")


@pytest.mark.slow
def test_trainer_import_loads_a_bounded_set_of_modules():
    code = ("import sys, torch; before = set(sys.modules); from trainwell import Trainer, TrainingArguments; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                         env=env).stdout
    ours = [name for name in out.split() if name.split(".")[0] == "trainwell"]
    assert "trainwell.trainer.trainer" in ours and "trainwell.args.fields" in ours
    assert not set(DEFERRED_MODULES) & set(ours)
    assert len(ours) <= MAX_TRAINER_IMPORT_MODULES, f"{len(ours)} modules: {ours}"


# -- the fast paths keep their behaviour -------------------------------------------------------------------------


def test_callback_keywords_follow_a_reassigned_optimizer_and_are_not_shared():
    """call_event builds the common keywords once; reassigning one of them (the Trainer sets the optimizer after
    building the handler) is seen at the next event, and a callback changing its kwargs changes nothing else."""
    from trainwell import TrainerCallback, TrainerControl, TrainerState
    from trainwell.callbacks.events import CallbackHandler

    seen = []

    class Spy(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(kwargs["optimizer"])
            kwargs["optimizer"] = "clobbered"

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append((logs, kwargs["optimizer"]))

    handler = CallbackHandler([Spy], model=None, processing_class=None, optimizer="first",
                              lr_scheduler=None)
    state, control = TrainerState(max_steps=10), TrainerControl()
    handler.on_step_end(None, state, control)
    handler.optimizer = "second"
    handler.on_step_end(None, state, control)
    handler.on_log(None, state, control, logs={"loss": 1.0})
    assert seen == ["first", "second", ({"loss": 1.0}, "second")]


def test_floating_point_ops_counts_tokens_or_rows():
    from torch import nn

    from trainwell import Trainer, TrainingArguments

    model = nn.Linear(4, 2)  # 10 parameters
    trainer = Trainer(model=model, args=TrainingArguments(output_dir=None, report_to="none", use_cpu=True))
    assert trainer.floating_point_ops({"input_ids": torch.zeros(3, 7, dtype=torch.long)}) == 6 * 10 * 21
    assert trainer.floating_point_ops({"mask": None, "x": torch.zeros(5, 4), "labels": torch.zeros(5)}) == 6 * 10 * 5
    assert trainer.floating_point_ops({"x": [1, 2]}) == 0
    assert trainer.floating_point_ops([torch.zeros(2)]) == 0


class _OptimizerStepSpy:
    """A duck-typed callback (module level, so that a handler holding it pickles)."""

    def __init__(self):
        self.calls = []

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.calls.append(kwargs["optimizer"])


def test_quiet_per_step_events_follow_in_place_changes_of_the_callback_list():
    """A per-step event nobody listens to is the shared no-op (the loop skips it); a callback appended, inserted or
    removed in place is seen at the next event, and a copied or pickled handler dispatches like the original."""
    import copy
    import pickle

    from trainwell import DefaultFlowCallback, TrainerControl, TrainerState
    from trainwell.callbacks.events import QUIET_EVENT, CallbackHandler

    handler = CallbackHandler([DefaultFlowCallback], model=None, processing_class=None, optimizer="opt",
                              lr_scheduler=None)
    state, control = TrainerState(max_steps=10), TrainerControl()
    assert handler.on_optimizer_step is QUIET_EVENT and handler.on_pre_optimizer_step is QUIET_EVENT
    spy = _OptimizerStepSpy()
    handler.callbacks.append(spy)
    assert handler.on_optimizer_step is not QUIET_EVENT
    handler.on_optimizer_step(None, state, control)
    assert spy.calls == ["opt"]
    for clone in (copy.deepcopy(handler), pickle.loads(pickle.dumps(handler))):
        clone.on_optimizer_step(None, state, control)
        assert [type(cb).__name__ for cb in clone.callbacks] == ["DefaultFlowCallback", "_OptimizerStepSpy"]
        assert clone.callbacks[1].calls == ["opt", "opt"] and spy.calls == ["opt"]  # its own copy was called
    del handler.callbacks[1]
    assert handler.on_optimizer_step is QUIET_EVENT
    handler.callbacks[0:0] = [spy]
    handler.on_optimizer_step(None, state, control)
    assert spy.calls == ["opt", "opt"]
    handler.callbacks.clear()
    assert handler.on_optimizer_step is QUIET_EVENT and handler._methods["on_step_end"] == []
    control.should_log = True
    assert handler.on_step_begin(None, state, control).should_log is False  # quiet, it still resets the flags


def test_a_callback_added_during_training_receives_the_following_steps(tiny, make_args):
    """The loop binds the run's methods once but reads the per-step events at every step: a callback that adds a
    listener mid-run (to the handler's list, in place) has it called from the next step on."""
    from trainwell import Trainer, TrainerCallback

    seen = []

    class Listener(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            seen.append(("pre", state.global_step))

        def on_optimizer_step(self, args, state, control, **kwargs):
            seen.append(("step", state.global_step))

    class AddsAtStep2(TrainerCallback):
        def __init__(self):
            self.handler = None

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                self.handler.callbacks.append(Listener())

    adder = AddsAtStep2()
    trainer = Trainer(model=tiny.RegressionModel(), args=make_args(max_steps=4, per_device_train_batch_size=4),
                      train_dataset=tiny.regression_data(32), callbacks=[adder])
    adder.handler = trainer.callback_handler
    trainer.train()
    assert seen == [("pre", 2), ("step", 2), ("pre", 3), ("step", 3)]  # steps 3 and 4 (global_step before +1)


def test_an_overridden_floating_point_ops_is_what_the_loop_counts(tiny, make_args):
    """The loop reads the FLOP counter once per run: the built-in rule, or a subclass's override when there is one."""
    from trainwell import Trainer

    class Counting(Trainer):
        def floating_point_ops(self, inputs):
            return 1000 * len(inputs["labels"])

    data = tiny.regression_data(20)  # batches of 8, 8 and 4 rows: a short last batch
    args = make_args(num_train_epochs=1, per_device_train_batch_size=8)
    plain = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=data)
    plain.train()
    counting = Counting(model=tiny.RegressionModel(), args=args, train_dataset=data)
    counting.train()
    assert counting.state.total_flos == 1000 * 20
    assert plain.state.total_flos == plain.floating_point_ops({"input_ids": torch.zeros(20, dtype=torch.long)})


def test_linear_schedule_multipliers_equal_upstreams_bit_for_bit():
    """The positional partial with its precomputed divisors gives upstream's floats exactly (odd warmup, the end,
    and steps past the end)."""
    transformers = pytest.importorskip("transformers")

    from trainwell import get_linear_schedule_with_warmup

    for warmup, total in ((0, 7), (3, 10), (7, 7), (5, 1000)):
        ours = get_linear_schedule_with_warmup(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
                                               warmup, total)
        theirs = transformers.get_linear_schedule_with_warmup(
            torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0), warmup, total)
        steps = range(total + 3)
        assert [ours.lr_lambdas[0](s) for s in steps] == [theirs.lr_lambdas[0](s) for s in steps], (warmup, total)


def test_default_collator_renames_a_tensor_label_column_and_keeps_the_others():
    """The tensor fast path skips ``label``/``label_ids`` (already renamed to ``labels``), ``None`` and strings."""
    from trainwell import default_data_collator

    rows = [{"x": torch.tensor([1.0, 2.0]), "label": torch.tensor(i), "note": "a", "mask": None,
             "ids": torch.tensor([i, i])} for i in range(3)]
    batch = default_data_collator(rows)
    assert list(batch) == ["labels", "x", "ids"]
    assert torch.equal(batch["labels"], torch.tensor([0, 1, 2])) and batch["labels"].dtype == torch.long
    assert torch.equal(batch["ids"], torch.tensor([[0, 0], [1, 1], [2, 2]]))
    with pytest.raises(ValueError, match="could not stack the values of key 'x'"):
        default_data_collator([{"x": torch.zeros(2)}, {"x": torch.zeros(3)}])


def test_a_handler_subclass_overriding_a_per_step_event_keeps_its_override():
    from trainwell import DefaultFlowCallback, TrainerControl, TrainerState
    from trainwell.callbacks.events import QUIET_EVENT, CallbackHandler

    class Counting(CallbackHandler):
        calls = 0

        def on_optimizer_step(self, args, state, control, **kwargs):
            self.calls += 1
            return super().on_optimizer_step(args, state, control, **kwargs)

    handler = Counting([DefaultFlowCallback], model=None, processing_class=None, optimizer=None, lr_scheduler=None)
    assert handler.on_optimizer_step is not QUIET_EVENT and handler.on_pre_optimizer_step is QUIET_EVENT
    handler.on_optimizer_step(None, TrainerState(), TrainerControl())
    assert handler.calls == 1
