"""A second run into a used output_dir: trains as the upstream Trainer does (same log_history, same weights), with one
warning naming the checkpoints it supersedes; rotation, resume and get_last_checkpoint put this run's checkpoints after
every earlier run's; the earlier run loses nothing before this run's newer checkpoint is complete; a kill while a
same-named checkpoint is replaced leaves one of the two complete."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import RegressionModel, regression_data, train_until_preempted
import trainwell
from trainwell import TrainerCallback
from trainwell.checkpoint.layout import (
    checkpoint_run,
    is_complete,
    list_complete_checkpoints,
    verify_checkpoint,
)
from trainwell.trainer_utils import get_last_checkpoint

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it
transformers.logging.set_verbosity_error()

TIMINGS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "total_flos")


def _trainer(lib: Any, out: Path, max_steps: int, model: torch.nn.Module | None = None, **kwargs: Any) -> Any:
    torch.manual_seed(0)
    kwargs.setdefault("save_steps", 3)
    kwargs.setdefault("learning_rate", 0.05)
    extra = {"use_cpu": True} if lib is transformers else {}
    args = lib.TrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=4,
                                 logging_steps=1, report_to="none", disable_tqdm=True,
                                 **extra, **kwargs)
    return lib.Trainer(model=model or RegressionModel(), args=args, train_dataset=regression_data(32))


def _numbers(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k not in TIMINGS} for entry in history]


def _weights(trainer: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _same(ours: Any, theirs: Any) -> None:
    """The same log_history (timings aside; numbers to float precision) and the same weights as upstream."""
    mine, upstream = _numbers(ours.state.log_history), _numbers(theirs.state.log_history)
    assert [sorted(e) for e in mine] == [sorted(e) for e in upstream]
    for entry, other in zip(mine, upstream):
        assert entry == pytest.approx(other, rel=1e-5), (entry, other)
    for key, value in _weights(theirs).items():
        assert torch.allclose(_weights(ours)[key], value, rtol=1e-6, atol=1e-7), key


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow  # over a second
def test_two_trainers_in_a_row_train_as_upstream_with_one_warning(tmp_path, caplog):
    """First run 6 steps (checkpoint-3, -6); second 2 steps, save_steps=1, save_total_limit=1: upstream's numbers,
    one warning naming both earlier checkpoints, and only the second run's checkpoint-2 is left."""
    runs = {}
    for lib in (transformers, trainwell):
        out = tmp_path / lib.__name__
        _trainer(lib, out, 6).train()
        second = _trainer(lib, out, 2, save_steps=1, save_total_limit=1)
        with caplog.at_level("WARNING", logger="trainwell"):
            second.train()
        runs[lib] = second
    _same(runs[trainwell], runs[transformers])
    warned = [r.getMessage() for r in caplog.records if "supersedes" in r.getMessage()]
    assert len(warned) == 1 and "checkpoint-3, checkpoint-6" in warned[0], warned
    out = tmp_path / "trainwell"
    assert [p.name for p in list_complete_checkpoints(out)] == ["checkpoint-2"]
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-2")
    assert runs[trainwell]._tw_checkpoints.of_this_run() == out / "checkpoint-2"


@pytest.mark.slow  # over a second
def test_a_notebook_running_train_twice_on_one_trainer_matches_upstream(tmp_path):
    """The cell run again: the second train() starts from the trained weights with a fresh optimizer, as upstream.
    Its checkpoint-3 and -6 replace the first run's (each through the atomic commit), and they are the second run's."""
    trainers = {}
    for lib in (transformers, trainwell):
        trainer = _trainer(lib, tmp_path / lib.__name__, 6)
        trainer.train()
        first = checkpoint_run(tmp_path / lib.__name__ / "checkpoint-6") if lib is trainwell else None
        trainer.train()
        trainers[lib] = trainer
    _same(trainers[trainwell], trainers[transformers])
    out = tmp_path / "trainwell"
    runs = {checkpoint_run(p) for p in list_complete_checkpoints(out)}
    assert len(runs) == 1 and first not in runs and None not in runs  # both replaced by the second run's
    for folder in list_complete_checkpoints(out):
        verify_checkpoint(folder)


class _Watch(TrainerCallback):
    """At every save, the complete checkpoints of output_dir (names, in their order) and whether the earlier run's
    newest one is still there."""

    def __init__(self, out: Path, earlier: Path) -> None:
        self.out, self.earlier, self.seen = out, earlier, []

    def on_save(self, args, state, control, **kwargs):
        self.seen.append(([p.name for p in list_complete_checkpoints(self.out)], is_complete(self.earlier)))


def test_rotation_removes_the_earlier_runs_checkpoints_first_and_only_after_a_newer_one(tmp_path):
    """Earlier run: checkpoint-3, -6. This run (save_steps=1, limit 2) rotates the earlier run's away oldest first,
    each only once two of its own are complete; never its own newest, whatever the step numbers."""
    out = tmp_path / "R"
    _trainer(trainwell, out, 6).train()
    second = _trainer(trainwell, out, 4, save_steps=1, save_total_limit=2)
    watch = _Watch(out, out / "checkpoint-6")
    second.add_callback(watch)
    second.train()
    assert watch.seen == [(["checkpoint-6", "checkpoint-1"], True),
                          (["checkpoint-1", "checkpoint-2"], False),
                          (["checkpoint-2", "checkpoint-3"], False),
                          (["checkpoint-3", "checkpoint-4"], False)]
    _trainer(trainwell, tmp_path / "S", 6).train()
    earlier = _digests(tmp_path / "S" / "checkpoint-6")
    third = _trainer(trainwell, tmp_path / "S", 1, save_steps=1, save_total_limit=2)
    third.train()
    assert [p.name for p in list_complete_checkpoints(tmp_path / "S")] == ["checkpoint-6", "checkpoint-1"]
    assert _digests(tmp_path / "S" / "checkpoint-6") == earlier  # kept (limit 2): not a byte changed


_CONSTANT: dict[str, Any] = {"learning_rate": 0.01, "lr_scheduler_type": "constant"}


def test_two_trials_sharing_output_dir_resume_the_newest_trials_checkpoint(tmp_path, caplog):
    """Trial 1 (lr 0.05) leaves checkpoint-3, -6; trial 2 (lr 0.01) checkpoint-2, -4. get_last_checkpoint, True and
    "auto" take trial 2's checkpoint-4 (not the higher step of trial 1), and the resume continues trial 2 exactly."""
    out = tmp_path / "R"
    _trainer(trainwell, out, 6).train()
    trial2 = _trainer(trainwell, out, 4, save_steps=2, **_CONSTANT)
    trial2.train()
    assert get_last_checkpoint(str(out)) == str(out / "checkpoint-4")
    full = _trainer(trainwell, tmp_path / "full", 6, save_steps=2, **_CONSTANT)
    full.train()
    shutil.copytree(out, tmp_path / "R2")  # the resume saves at its last step: each way gets its own copy
    for how, folder in ((True, out), ("auto", tmp_path / "R2")):
        resumed = _trainer(trainwell, folder, 6, save_steps=100, **_CONSTANT)
        with caplog.at_level("WARNING", logger="trainwell"):
            resumed.train(resume_from_checkpoint=how)
        assert resumed._tw_checkpoints.resumed_from == folder / "checkpoint-4"
        assert resumed.state.global_step == 6
        for key, value in _weights(full).items():
            assert torch.allclose(_weights(resumed)[key], value, atol=1e-6), key


class _CtrlCAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_in_a_second_run_keeps_and_names_its_checkpoint(tmp_path, caplog):
    """The earlier run left checkpoint-3, -6; this fresh run (limit 1) is stopped by Ctrl-C at step 2: its
    checkpoint-2 is kept (not the earlier checkpoint-6 in its place), and the advice's True takes it."""
    out = tmp_path / "R"
    _trainer(trainwell, out, 6).train()
    second = _trainer(trainwell, out, 20, save_steps=100, save_total_limit=1)
    second.add_callback(_CtrlCAt(2))
    with caplog.at_level("WARNING", logger="trainwell"):
        train_until_preempted(second)
    assert second.preempted and second.state.global_step == 2
    assert [p.name for p in list_complete_checkpoints(out)] == ["checkpoint-2"]
    advice = [r.getMessage() for r in caplog.records if "preempted" in r.getMessage()]
    assert advice and "resume_from_checkpoint=True) (it takes checkpoint-2" in advice[0], advice
    again = _trainer(trainwell, out, 3, save_steps=100)
    again.train(resume_from_checkpoint=True)
    assert again._tw_checkpoints.resumed_from == out / "checkpoint-2"


_REPLACE_JOB = """
import sys, torch
sys.path.insert(0, {tests!r})
from helpers import RegressionModel, regression_data
from trainwell import Trainer, TrainingArguments
torch.manual_seed(0)
args = TrainingArguments(output_dir={out!r}, max_steps=3, save_steps=3, per_device_train_batch_size=4,
                         learning_rate=0.01, report_to="none", disable_tqdm=True)
Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(32)).train()
"""


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["rename", "aside"])
def test_a_kill_while_replacing_an_earlier_runs_checkpoint_keeps_the_new_one(tmp_path, phase, caplog):
    """The second run (a process) is SIGKILLed while its checkpoint-3 replaces the first run's: after its marker,
    before the swap (``rename``), or between the two renames (``aside``). Its checkpoint-3 is sealed, so it is never
    "incomplete": the next ``train()`` puts it in place (finishing the replace) and resumes it. Before the fix the
    ``rename`` kill lost it (deleted as incomplete) and ``resume_from_checkpoint=True`` continued the first run's
    weights. After the ``aside`` kill, ``get_last_checkpoint`` (read before the start) names the first run's
    checkpoint-6: ``train()`` warns that it continues an older run than the checkpoint-3 it just put in place."""
    out = tmp_path / "R"
    _trainer(trainwell, out, 6).train()
    first = checkpoint_run(out / "checkpoint-3")
    kept = _digests(out / "checkpoint-6")
    job = _REPLACE_JOB.format(tests=str(Path(__file__).resolve().parents[1]), out=str(out))
    env = dict(os.environ, TRAINWELL_TEST_KILL_AT=f"{phase}:3:0", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", job], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert (out / "checkpoint-3").exists() == (phase == "rename")
    (sealed,) = [p for p in out.iterdir() if p.name.startswith(".tmp-checkpoint-3-") and not p.suffix]
    new = _digests(sealed)
    if phase == "rename":
        again = _trainer(trainwell, out, 3)
        again.train(resume_from_checkpoint=True)
        assert again._tw_checkpoints.resumed_from == out / "checkpoint-3"
    else:
        last = get_last_checkpoint(out)
        assert last == str(out / "checkpoint-6")  # the first run's: the new checkpoint-3 is not in place yet
        again = _trainer(trainwell, out, 6)
        with caplog.at_level("WARNING", logger="trainwell"):
            again.train(resume_from_checkpoint=last)
        warned = [r.getMessage() for r in caplog.records if "earlier run" in r.getMessage()]
        assert len(warned) == 1 and "checkpoint-3" in warned[0] and "get_last_checkpoint" in warned[0], warned
        assert get_last_checkpoint(out) == str(out / "checkpoint-3")  # once in place, the newest
    verify_checkpoint(out / "checkpoint-3")
    assert checkpoint_run(out / "checkpoint-3") != first
    assert _digests(out / "checkpoint-3") == new  # the sealed checkpoint, as the killed run wrote it
    assert _digests(out / "checkpoint-6") == kept
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".tmp-")) == []
