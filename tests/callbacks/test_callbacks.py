"""Tests for trainwell.callbacks.events (CallbackHandler) and trainwell.callbacks (flow, progress, printer,
early stopping, integrations)."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from trainwell.callbacks import (
    DefaultFlowCallback,
    EarlyStoppingCallback,
    MLflowCallback,
    PrinterCallback,
    ProgressCallback,
    TensorBoardCallback,
    TrainerCallback,
    get_reporting_integration_callbacks,
)
from trainwell.callbacks.integrations import rewrite_logs
from trainwell.callbacks.events import EVENTS, CallbackHandler
from trainwell.utils.trainer_state import TrainerControl, TrainerState
from trainwell.trainer_utils import IntervalStrategy, SaveStrategy

COMMON_KWARGS = {
    "model", "processing_class", "tokenizer", "optimizer", "lr_scheduler", "train_dataloader", "eval_dataloader",
}


def make_args(**overrides):
    """A stand-in for TrainingArguments with the fields the callbacks read."""
    fields = dict(
        logging_first_step=False, logging_strategy="steps", eval_strategy="no", save_strategy="steps",
        eval_delay=0, logging_steps=500, eval_steps=None, save_steps=500, disable_tqdm=False,
        metric_for_best_model=None, greater_is_better=None, load_best_model_at_end=False,
        output_dir="out", logging_dir="out/runs", run_name="run",
    )
    fields.update(overrides)
    return SimpleNamespace(**fields)


class Recorder(TrainerCallback):
    """Records every event with the keyword arguments it received."""

    def __init__(self):
        self.calls = []

    def __getattribute__(self, name):
        if name in EVENTS:
            def record(args, state, control, **kwargs):
                self.calls.append((name, kwargs))
            return record
        return super().__getattribute__(name)


def make_handler(*callbacks):
    return CallbackHandler(list(callbacks), model="M", processing_class="T", optimizer="O", lr_scheduler="S")


# -- EVENTS / base ----------------------------------------------------------------------------------
def test_events_have_base_and_handler_methods():
    assert EVENTS[:2] == ("on_init_end", "on_train_begin")
    for event in EVENTS:
        assert getattr(TrainerCallback, event).__doc__, event
        assert callable(getattr(CallbackHandler, event)), event
    base_events = {name for name in vars(TrainerCallback) if name.startswith("on_")}
    assert base_events == set(EVENTS)


# -- CallbackHandler -------------------------------------------------------------------------------
def test_dispatch_order_and_kwargs():
    rec = Recorder()
    handler = make_handler(DefaultFlowCallback(), rec)
    handler.train_dataloader, handler.eval_dataloader = "TD", "ED"
    args, state, control = make_args(), TrainerState(max_steps=10), TrainerControl()
    handler.on_train_begin(args, state, control)
    handler.on_step_begin(args, state, control)
    handler.on_log(args, state, control, logs={"loss": 1.0})
    handler.on_evaluate(args, state, control, metrics={"eval_loss": 2.0})
    handler.on_train_end(args, state, control)
    expected = ["on_train_begin", "on_step_begin", "on_log", "on_evaluate", "on_train_end"]
    assert [name for name, _ in rec.calls] == expected
    kwargs = rec.calls[2][1]
    assert set(kwargs) == COMMON_KWARGS | {"logs"}
    assert (kwargs["model"], kwargs["tokenizer"], kwargs["processing_class"]) == ("M", "T", "T")
    assert (kwargs["optimizer"], kwargs["lr_scheduler"]) == ("O", "S")
    assert (kwargs["train_dataloader"], kwargs["eval_dataloader"]) == ("TD", "ED")
    assert kwargs["logs"] == {"loss": 1.0}
    assert rec.calls[3][1]["metrics"] == {"eval_loss": 2.0}


def test_callbacks_called_in_registration_order():
    order = []

    class A(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            order.append("A")

    class B(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            order.append("B")

    handler = make_handler(B(), A(), DefaultFlowCallback())
    handler.on_log(make_args(), TrainerState(), TrainerControl(), logs={})
    assert order == ["B", "A"]


def test_returned_control_replaces_and_is_seen_by_next_callback():
    replacement = TrainerControl(should_training_stop=True)
    seen = []

    class Replace(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            return replacement

    class Observe(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            seen.append(control)

    handler = make_handler(Replace(), Observe(), DefaultFlowCallback())
    result = handler.on_step_end(make_args(), TrainerState(global_step=1, max_steps=10), TrainerControl())
    assert result is replacement and seen == [replacement]


def test_handler_resets_flags_before_dispatch():
    handler = make_handler(DefaultFlowCallback())
    args, state = make_args(), TrainerState()
    control = TrainerControl(True, True, True, True, True)
    handler.on_step_begin(args, state, control)
    assert not (control.should_log or control.should_evaluate or control.should_save)
    control.should_log = control.should_evaluate = control.should_save = True
    handler.on_log(args, state, control, logs={})
    handler.on_evaluate(args, state, control, metrics={})
    handler.on_save(args, state, control)
    assert not (control.should_log or control.should_evaluate or control.should_save)
    handler.on_epoch_begin(args, state, control)
    handler.on_train_begin(args, state, control)
    assert not (control.should_epoch_stop or control.should_training_stop)


def test_only_overriding_callbacks_are_listeners():
    flow, printer = DefaultFlowCallback(), PrinterCallback()
    handler = make_handler(flow, printer)
    assert handler._listeners["on_step_begin"] == []
    assert handler._listeners["on_step_end"] == [flow]
    assert handler._listeners["on_log"] == [printer]
    handler.pop_callback(printer)
    assert handler._listeners["on_log"] == []


def test_duck_typed_and_in_place_appended_callbacks_are_called():
    calls = []

    class Duck:  # not a TrainerCallback subclass (e.g. a callback written for another library)
        def on_save(self, args, state, control, **kwargs):
            calls.append(kwargs["model"])

    handler = make_handler(DefaultFlowCallback())
    handler.callbacks.append(Duck())
    handler.on_save(make_args(), TrainerState(), TrainerControl())
    assert calls == ["M"]


def test_add_pop_remove_and_callback_list(caplog):
    handler = make_handler(DefaultFlowCallback)
    assert isinstance(handler.callbacks[0], DefaultFlowCallback)
    printer = PrinterCallback()
    handler.add_callback(printer)
    with caplog.at_level(logging.WARNING, logger="trainwell.callbacks.events"):
        handler.add_callback(PrinterCallback)
    assert "already one" in caplog.text
    assert handler.callback_list == "DefaultFlowCallback\nPrinterCallback\nPrinterCallback"
    assert handler.pop_callback(PrinterCallback) is printer  # a class pops its first instance
    second = handler.callbacks[1]
    assert handler.pop_callback(second) is second
    assert handler.pop_callback(PrinterCallback) is None
    handler.remove_callback(DefaultFlowCallback)
    assert handler.callbacks == [] and handler.callback_list == ""


def test_missing_flow_callback_warns(caplog):
    with caplog.at_level(logging.WARNING, logger="trainwell.callbacks.events"):
        make_handler(PrinterCallback())
    assert "DefaultFlowCallback" in caplog.text


# -- DefaultFlowCallback ---------------------------------------------------------------------------
def simulate(args, *, epochs, steps_per_epoch, logging_steps=500, eval_steps=500, save_steps=500):
    """Drive the flow callback like the training loop does; return the actions taken per step."""
    handler = make_handler(DefaultFlowCallback())
    state = TrainerState(max_steps=epochs * steps_per_epoch, logging_steps=logging_steps,
                         eval_steps=eval_steps, save_steps=save_steps)
    control, actions = TrainerControl(), []
    handler.on_train_begin(args, state, control)
    for epoch in range(epochs):
        handler.on_epoch_begin(args, state, control)
        for step in range(steps_per_epoch):
            control = handler.on_step_begin(args, state, control)
            state.global_step += 1
            state.epoch = epoch + (step + 1) / steps_per_epoch
            control = handler.on_step_end(args, state, control)
            actions.append(_act(handler, args, state, control, f"s{state.global_step}"))
            if control.should_training_stop:
                break
        control = handler.on_epoch_end(args, state, control)
        actions.append(_act(handler, args, state, control, f"e{epoch + 1}"))
        if control.should_training_stop:
            break
    return [a for a in actions if a[1]], control


def _act(handler, args, state, control, where):
    done = "".join(flag for flag, on in (("L", control.should_log), ("E", control.should_evaluate),
                                         ("S", control.should_save)) if on)
    control.should_log = control.should_evaluate = control.should_save = False  # the trainer acted
    return (where, done)


def test_flow_step_strategies():
    args = make_args(logging_first_step=True, eval_strategy="steps", save_strategy="steps")
    actions, control = simulate(args, epochs=1, steps_per_epoch=8, logging_steps=2, eval_steps=3, save_steps=4)
    # the last step (8, not a multiple of eval_steps) is evaluated too, as transformers 5.24
    assert actions == [("s1", "L"), ("s2", "L"), ("s3", "E"), ("s4", "LS"), ("s6", "LE"), ("s8", "LES")]
    assert control.should_training_stop


def test_flow_eval_delay_in_steps_and_enum_members():
    args = make_args(logging_strategy=IntervalStrategy.NO, eval_strategy=IntervalStrategy.STEPS,
                     save_strategy=SaveStrategy.NO, eval_delay=4)
    actions, _ = simulate(args, epochs=1, steps_per_epoch=9, eval_steps=3)
    assert actions == [("s6", "E"), ("s9", "E")]  # 3 < eval_delay; save_strategy=no saves nothing, not even at the end


def test_flow_evaluates_the_last_step_unless_eval_delay_is_beyond_it():
    args = make_args(logging_strategy="no", eval_strategy="steps", save_strategy="no", eval_delay=7)
    assert simulate(args, epochs=1, steps_per_epoch=7, eval_steps=3)[0] == [("s7", "E")]
    args.eval_delay = 8
    assert simulate(args, epochs=1, steps_per_epoch=7, eval_steps=3)[0] == []


def test_flow_epoch_strategies_with_eval_delay():
    args = make_args(logging_strategy="epoch", eval_strategy="epoch", save_strategy="epoch", eval_delay=1.5)
    actions, control = simulate(args, epochs=3, steps_per_epoch=2)
    # the last step saves nothing of its own (as transformers 5.24): the epoch's end logs, evaluates and saves once
    assert actions == [("e1", "LS"), ("e2", "LES"), ("e3", "LES")]
    assert control.should_training_stop


def test_flow_best_strategy_does_not_save_at_end_and_zero_intervals_are_safe():
    args = make_args(save_strategy="best", logging_strategy="steps")
    actions, _ = simulate(args, epochs=1, steps_per_epoch=3, logging_steps=0, save_steps=0)
    assert actions == []


def test_flow_save_steps_zero_saves_only_the_last_step_as_upstream():
    """``save_steps=0`` with ``save_strategy="steps"``: no save on the way, one at the end (transformers 5.24's
    flow; trainwell refused the value before)."""
    args = make_args(save_strategy="steps", logging_strategy="no")
    actions, _ = simulate(args, epochs=1, steps_per_epoch=5, save_steps=0)
    assert actions == [("s5", "S")]


def test_flow_with_real_training_arguments(tmp_path):
    args_module = pytest.importorskip("trainwell.args.fields")
    args = args_module.TrainingArguments(
        output_dir=str(tmp_path), eval_strategy="steps", eval_steps=2, logging_steps=3, save_steps=4,
        report_to="none",
    )
    actions, _ = simulate(args, epochs=1, steps_per_epoch=6, logging_steps=3, eval_steps=2, save_steps=4)
    assert actions == [("s2", "E"), ("s3", "L"), ("s4", "ES"), ("s6", "LES")]


# -- EarlyStoppingCallback -------------------------------------------------------------------------
def run_evals(callback, args, values):
    """Fire on_evaluate for each value, updating best_metric afterwards as the trainer does."""
    state, control, stops = TrainerState(), TrainerControl(), []
    greater = bool(args.greater_is_better)
    for value in values:
        callback.on_evaluate(args, state, control, metrics={"eval_loss": value, "eval_acc": value})
        stops.append(control.should_training_stop)
        if state.best_metric is None or (value > state.best_metric if greater else value < state.best_metric):
            state.best_metric = value
    return stops


def test_early_stopping_after_patience():
    args = make_args(eval_strategy="steps", metric_for_best_model="loss", greater_is_better=False)
    callback = EarlyStoppingCallback(early_stopping_patience=2)
    assert run_evals(callback, args, [1.0, 0.8, 0.85, 0.9]) == [False, False, False, True]
    assert callback.early_stopping_patience_counter == 2


def test_early_stopping_threshold_and_improvement_resets():
    args = make_args(eval_strategy="epoch", metric_for_best_model="eval_acc", greater_is_better=True)
    callback = EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.05)
    # 0.52 beats 0.5 by less than the threshold (no improvement), 0.7 resets, then two small gains stop
    assert run_evals(callback, args, [0.5, 0.52, 0.7, 0.71, 0.72]) == [False, False, False, False, True]


def test_early_stopping_checks_arguments_and_missing_metric(caplog):
    callback = EarlyStoppingCallback()
    state, control = TrainerState(), TrainerControl()
    with pytest.raises(ValueError, match="eval_strategy"):
        callback.on_train_begin(make_args(metric_for_best_model="loss", eval_strategy="no"), state, control)
    with pytest.raises(ValueError, match="metric_for_best_model"):
        callback.on_train_begin(make_args(eval_strategy="steps"), state, control)
    with pytest.raises(ValueError, match="early_stopping_patience"):
        EarlyStoppingCallback(early_stopping_patience=0)
    args = make_args(eval_strategy="steps", metric_for_best_model="f1")
    with caplog.at_level(logging.WARNING):
        callback.on_evaluate(args, state, control, metrics={"eval_loss": 1.0})
    assert "eval_f1" in caplog.text and callback.early_stopping_patience_counter == 0


def test_early_stopping_state_round_trip():
    callback = EarlyStoppingCallback(3, 0.1)
    callback.early_stopping_patience_counter = 2
    rebuilt = EarlyStoppingCallback.from_state(callback.state())
    assert (rebuilt.early_stopping_patience, rebuilt.early_stopping_threshold) == (3, 0.1)
    assert rebuilt.early_stopping_patience_counter == 2
    assert TrainerState(stateful_callbacks=[callback]).stateful_callbacks["EarlyStoppingCallback"] == callback.state()


# -- PrinterCallback / ProgressCallback ------------------------------------------------------------
def test_printer_prints_logs_without_total_flos(capsys):
    logs = {"loss": 0.123456789, "total_flos": 123.0, "epoch": 1.0, "step": 3}
    PrinterCallback().on_log(make_args(), TrainerState(), TrainerControl(), logs=logs)
    # upstream 5.x's format: floats as 4 significant digits (strings), other values as they are
    assert capsys.readouterr().out == "{'loss': '0.1235', 'epoch': '1', 'step': 3}\n"
    assert "total_flos" in logs  # the shared dict is not mutated
    PrinterCallback().on_log(make_args(), TrainerState(is_local_process_zero=False), TrainerControl(), logs=logs)
    assert capsys.readouterr().out == ""


def _run_progress(args, state, logs):
    callback, control = ProgressCallback(max_str_len=10), TrainerControl()
    callback.on_train_begin(args, state, control)
    for step in (1, 2, 4):  # a jump by 2 (e.g. a resumed run) advances the bar by 2
        state.global_step = step
        callback.on_step_end(args, state, control)
    reached = callback.training_bar.n
    callback.on_log(args, state, control, logs=logs)
    callback.on_train_end(args, state, control)
    return callback, reached


def test_progress_bar_and_logs(capsys):
    logs = {"loss": 0.25, "epoch": 1.23456, "total_flos": 1.0, "note": "x" * 20}
    callback, reached = _run_progress(make_args(), TrainerState(max_steps=4), logs)
    out, err = capsys.readouterr()
    assert reached == 4 and callback.training_bar is None
    assert "'loss': '0.25'" in out and "'epoch': '1.235'" in out and "total_flos" not in out
    assert "String too long to display, length: 20 > 10" in out
    assert "4/4" in err


def test_progress_disabled_prints_nothing(capsys):
    _run_progress(make_args(disable_tqdm=True), TrainerState(max_steps=4), {"loss": 0.25})
    assert capsys.readouterr() == ("", "")


def test_progress_prediction_bar():
    callback, args, state, control = ProgressCallback(), make_args(disable_tqdm=True), TrainerState(), TrainerControl()
    for _ in range(3):
        callback.on_prediction_step(args, state, control, eval_dataloader=[0, 1, 2])
    assert callback.prediction_bar.total == 3
    callback.on_evaluate(args, state, control, metrics={})
    assert callback.prediction_bar is None
    callback.on_prediction_step(args, state, control, eval_dataloader=iter([1, 2]))  # no len: no bar
    assert callback.prediction_bar is None


# -- integrations ----------------------------------------------------------------------------------
class FakeWriter:
    def __init__(self, log_dir=None):
        self.log_dir, self.scalars, self.texts, self.flushes, self.closed = log_dir, [], [], 0, False

    def add_scalar(self, tag, value, step):
        self.scalars.append((tag, value, step))

    def add_text(self, tag, text, step=None):
        self.texts.append((tag, text, step))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def test_rewrite_logs():
    assert rewrite_logs({"loss": 1, "eval_acc": 2, "test_f1": 3}) == {"train/loss": 1, "eval/acc": 2, "test/f1": 3}


def test_tensorboard_callback_with_given_writer():
    writer = FakeWriter()
    callback, state, control = TensorBoardCallback(tb_writer=writer), TrainerState(global_step=3), TrainerControl()
    args = make_args()
    callback.on_train_begin(args, state, control, model=None)
    callback.on_log(args, state, control, logs={"loss": 0.5, "eval_loss": 0.25, "note": "hi", "bad": [1]})
    callback.on_train_end(args, state, control)
    assert writer.texts[0][0] == "args" and '"run_name": "run"' in writer.texts[0][1]
    assert writer.scalars == [("train/loss", 0.5, 3), ("eval/loss", 0.25, 3)]
    assert ("train/note", "hi", 3) in writer.texts
    assert writer.flushes == 1 and writer.closed and callback.tb_writer is None


def test_tensorboard_missing_package_names_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ImportError, match=r"pip install trainwell\[tensorboard\]"):
        TensorBoardCallback().on_train_begin(make_args(), TrainerState(), TrainerControl())


def test_tensorboard_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    args = make_args(logging_dir=str(tmp_path / "runs"))
    callback, state, control = TensorBoardCallback(), TrainerState(global_step=1), TrainerControl()
    callback.on_train_begin(args, state, control)
    callback.on_log(args, state, control, logs={"loss": 0.5})
    callback.on_train_end(args, state, control)
    assert list((tmp_path / "runs").glob("events.out.tfevents.*"))


def test_mlflow_missing_package_names_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ImportError, match=r"pip install trainwell\[mlflow\]"):
        MLflowCallback()  # at construction, as upstream: the Trainer is not built


def test_reporting_integration_mapping(monkeypatch):
    pytest.importorskip("tensorboard")  # the name it maps is installed (the `test` extra; not `test-fast`)
    assert get_reporting_integration_callbacks(["tensorboard"]) == [TensorBoardCallback]
    assert get_reporting_integration_callbacks("none") == []
    assert get_reporting_integration_callbacks(None) == []
    with pytest.raises(ValueError, match=r"wandbx.*supported: \['azure_ml', 'clearml', 'codecarbon', 'comet_ml'"):
        get_reporting_integration_callbacks(["wandbx"])
    from trainwell.callbacks import integrations

    monkeypatch.setattr(integrations, "get_available_reporting_integrations", lambda: ["tensorboard"])
    assert get_reporting_integration_callbacks("all") == [TensorBoardCallback]
