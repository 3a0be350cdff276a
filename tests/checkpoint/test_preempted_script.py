"""A script preempted by a real SIGINT/SIGTERM ends as upstream's does: the checkpoint is saved, then ``train()``
raises ``TrainingPreempted``, nothing after it runs, and the process exits with the signal's status (130 / 143; a
job wrapper requeues on it). A script that catches it goes on, with the ``TrainOutput``. The routes users launch: the
import swap (``python script.py``) and ``trainwell run`` over a script written for transformers.

This file is also the job: ``python test_preempted_script.py OUT SIGNAL ROUTE`` sends SIGNAL to itself at step 3
of 8 (a callback), then writes OUT/after_train.json only if the script got past ``train()``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _job(out: str, signal_name: str, route: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared tiny model and data
    from helpers import RegressionModel, regression_data

    if route == "transformers":  # written for upstream; `trainwell run` swaps the Trainer in
        from transformers import Trainer, TrainerCallback, TrainingArguments
    else:
        from trainwell import Trainer, TrainerCallback, TrainingArguments
    from trainwell import TrainingPreempted

    class SignalAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                os.kill(os.getpid(), getattr(signal, signal_name))

    args = TrainingArguments(output_dir=out, max_steps=8, per_device_train_batch_size=2, save_strategy="no",
                             enable_jit_checkpoint=True, report_to="none", disable_tqdm=True, use_cpu=True)
    trainer = Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16),
                      callbacks=[SignalAtStep3()])
    if route == "catch":
        try:
            trainer.train()
        except TrainingPreempted as stop:
            result = {"caught": type(stop).__name__, "signal": stop.signal_name, "checkpoint": stop.checkpoint,
                      "global_step": stop.output.global_step}
    else:
        trainer.train()
        result = {"caught": None}
    Path(out, "after_train.json").write_text(json.dumps(result))


def _run(tmp_path: Path, signal_name: str, route: str):
    from helpers.launch import ROOT, run

    out = tmp_path / "out"
    script = Path(__file__).resolve()
    if route == "transformers":
        pytest.importorskip("transformers")
        trainwell_cli = Path(sys.executable).with_name("trainwell")
        command = [str(trainwell_cli) if trainwell_cli.exists() else sys.executable, *(
            [] if trainwell_cli.exists() else ["-m", "trainwell"]), "run", str(script), str(out), signal_name, route]
    else:
        command = [sys.executable, str(script), str(out), signal_name, route]
    done = run(command, f"the {route} script", timeout=240, check=False, cwd=ROOT)
    return done, out


@pytest.mark.parametrize(("signal_name", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_preempted_script_saves_then_exits_with_the_signals_status(tmp_path, signal_name, status):
    done, out = _run(tmp_path, signal_name, "import")
    assert done.returncode == status, done.stdout[-2000:]
    assert (out / "checkpoint-3" / "model.safetensors").is_file()
    assert not (out / "after_train.json").exists()  # nothing after train() ran as if training had finished
    assert f"Training preempted by {signal_name} at step 3" in done.stdout


def test_a_script_that_catches_training_preempted_goes_on(tmp_path):
    done, out = _run(tmp_path, "SIGTERM", "catch")
    assert done.returncode == 0, done.stdout[-2000:]
    assert json.loads((out / "after_train.json").read_text()) == {
        "caught": "TrainingPreempted", "signal": "SIGTERM", "checkpoint": str(out / "checkpoint-3"),
        "global_step": 3}


def test_a_transformers_script_under_trainwell_run_exits_143_on_sigterm(tmp_path):
    done, out = _run(tmp_path, "SIGTERM", "transformers")
    assert done.returncode == 143, done.stdout[-2000:]
    assert (out / "checkpoint-3" / "model.safetensors").is_file()
    assert not (out / "after_train.json").exists()


if __name__ == "__main__":
    _job(sys.argv[1], sys.argv[2], sys.argv[3])
