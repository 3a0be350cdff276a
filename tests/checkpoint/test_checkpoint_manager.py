"""CheckpointManager (save / load / rotate / resume / fallback) and PreemptionGuard."""

from __future__ import annotations

import json
import os
import random
import signal
import threading
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell.checkpoint import (
    COMPLETE_MARKER,
    CheckpointContents,
    CheckpointError,
    CheckpointManager,
    PreemptionGuard,
    list_complete_checkpoints,
)

torch.set_num_threads(1)


class Counter:
    """An ``extra`` object: anything with state_dict/load_state_dict."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class State:
    def __init__(self, step: int) -> None:
        self.global_step = step

    def save_to_json(self, path: str) -> None:
        Path(path).write_text(json.dumps({"global_step": self.global_step}))


class Args:
    def __init__(self) -> None:
        self.learning_rate = 0.1

    def to_json_string(self) -> str:
        return json.dumps({"learning_rate": self.learning_rate})


class Tokenizer:
    def save_pretrained(self, folder: str) -> None:
        Path(folder, "tokenizer.json").write_text("{}")


def _setup(seed: int, steps: int = 1) -> CheckpointContents:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(steps):
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
        sched.step()
        opt.zero_grad()
    return CheckpointContents(model=model, optimizer=opt, scheduler=sched, extra={"counter": Counter(seed)},
                              trainer_state=State(steps), args=Args(), data_state={"epoch": 1, "batches": 3},
                              processing_class=Tokenizer())


def _weights(contents: CheckpointContents) -> dict:
    return {k: v.clone() for k, v in contents.model.state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_save_then_load_restores_everything(tmp_path):
    manager = CheckpointManager(tmp_path)
    src = _setup(0, steps=2)
    folder = manager.save(2, src)
    assert folder == tmp_path / "checkpoint-2"
    names = {p.name for p in folder.iterdir()}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "counter.pt", "rng_state.pth", "trainer_state.json",
            "training_args.json", "training_args.bin", "data_state.json", "tokenizer.json", COMPLETE_MARKER} == names
    expected_draw = (random.random(), torch.rand(2))

    dst = _setup(5, steps=0)
    result = manager.load(folder, dst, load_trainer_state=lambda p: json.loads(Path(p).read_text()))
    assert random.random() == expected_draw[0] and torch.equal(torch.rand(2), expected_draw[1])
    assert _same(_weights(dst), _weights(src))
    assert dst.scheduler.last_epoch == 2 and dst.optimizer.param_groups[0]["lr"] == pytest.approx(0.025)
    saved_exp = src.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(dst.optimizer.state_dict()["state"][0]["exp_avg"], saved_exp)
    assert dst.extra["counter"].value == 0
    assert result["data_state"] == {"epoch": 1, "batches": 3}
    assert result["trainer_state"] == {"global_step": 2}
    assert result["trainer_state_path"] == str(folder / "trainer_state.json")
    assert result["loaded"] == ["model", "optimizer", "scheduler", "counter", "rng"]


def test_rotation_keeps_best_and_newest_with_limit_one(tmp_path):
    manager = CheckpointManager(tmp_path, save_total_limit=1)
    contents = _setup(0, steps=0)
    for step in (1, 2, 3, 4):
        manager.save(step, contents)
    deleted = manager.rotate(best_model_checkpoint=str(tmp_path / "checkpoint-2"))
    assert [p.name for p in deleted] == ["checkpoint-1", "checkpoint-3"]
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-4"]
    manager.save(5, contents)
    assert [p.name for p in manager.rotate(None)] == ["checkpoint-2", "checkpoint-4"]
    assert CheckpointManager(tmp_path, save_total_limit=None).rotate(None) == []


def test_rotation_limit_two_deletes_oldest_first(tmp_path):
    manager = CheckpointManager(tmp_path, save_total_limit=2)
    contents = _setup(0, steps=0)
    for step in (10, 20, 30, 40, 50):
        manager.save(step, contents)
    assert [p.name for p in manager.rotate(str(tmp_path / "checkpoint-10"))] == [
        "checkpoint-20", "checkpoint-30", "checkpoint-40"]


def test_resolve_resume(tmp_path):
    manager = CheckpointManager(tmp_path / "out")
    assert manager.resolve_resume(None) is None and manager.resolve_resume(False) is None
    with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory \(.*out\)"):
        manager.resolve_resume(True)
    manager.save(3, _setup(0, steps=0))
    manager.save(7, _setup(0, steps=0))
    assert manager.resolve_resume(True) == tmp_path / "out" / "checkpoint-7"
    (tmp_path / "out" / "checkpoint-9").mkdir()  # no marker: another tool's checkpoint, resumable (validated on load)
    assert manager.resolve_resume(True) == tmp_path / "out" / "checkpoint-9"
    assert manager.resolve_resume(str(tmp_path / "out" / "checkpoint-3")) == tmp_path / "out" / "checkpoint-3"
    assert manager.resolve_resume(str(tmp_path / "out" / "checkpoint-9")) == tmp_path / "out" / "checkpoint-9"
    with pytest.raises(ValueError, match="no such checkpoint folder"):
        manager.resolve_resume(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="is an output_dir, not a checkpoint folder: pass .*checkpoint-9"):
        manager.resolve_resume(str(tmp_path / "out"))
    with pytest.raises(CheckpointError, match=r"checkpoint-9: no model weights found"):
        manager.load(tmp_path / "out" / "checkpoint-9", _setup(0, steps=0))


def test_load_latest_valid_falls_back_when_newest_is_truncated(tmp_path):
    manager = CheckpointManager(tmp_path)
    first = _setup(1)
    manager.save(1, first)
    manager.save(2, _setup(2))
    model_file = tmp_path / "checkpoint-2" / "model.safetensors"
    model_file.write_bytes(model_file.read_bytes()[:-16])

    dst = _setup(9, steps=0)
    with pytest.warns(UserWarning, match=r"checkpoint-2 is damaged \(.*model\.safetensors.*\); falling back to .*checkpoint-1"):
        folder, result = manager.load_latest_valid(dst)
    assert folder == tmp_path / "checkpoint-1"
    assert _same(_weights(dst), _weights(first))
    assert dst.extra["counter"].value == 1 and result["data_state"]["batches"] == 3


def test_load_latest_valid_raises_when_all_damaged_and_model_untouched(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _setup(1))
    (tmp_path / "checkpoint-1" / "optimizer.pt").write_bytes(b"garbage")  # model file is fine, optimizer is not
    dst = _setup(9, steps=0)
    before = _weights(dst)
    with pytest.raises(CheckpointError, match="optimizer.pt"):
        manager.load_latest_valid(dst)
    assert _same(_weights(dst), before)  # validated everything before applying anything
    with pytest.raises(ValueError, match="No valid checkpoint found in output directory"):
        CheckpointManager(tmp_path / "empty").load_latest_valid(dst)


def test_optimizer_mismatch_is_reported_before_model_changes(tmp_path):
    manager = CheckpointManager(tmp_path)
    manager.save(1, _setup(1))
    dst = _setup(9, steps=0)
    dst.optimizer = torch.optim.SGD(list(dst.model.parameters())[:2], lr=0.1)
    before = _weights(dst)
    with pytest.raises(CheckpointError, match=r"optimizer\.pt: optimizer parameter groups have sizes \[4\] .* \[2\]"):
        manager.load(tmp_path / "checkpoint-1", dst)
    assert _same(_weights(dst), before)


def test_save_only_model_and_per_rank_rng_file_name(tmp_path):
    contents = _setup(0)
    contents.save_only_model = True
    folder = CheckpointManager(tmp_path).save(1, contents)
    assert {p.name for p in folder.iterdir()} >= {"model.safetensors", "trainer_state.json"}
    assert not (folder / "optimizer.pt").exists() and not (folder / "rng_state.pth").exists()

    # Every rank's rng_state_<rank>.pth is written into the temporary folder before the marker: a real 2-process
    # job checks it (tests/distributed/test_kill_resume.py, tests/checkpoint/test_checkpoint_tamper.py).
    contents.save_only_model = False
    CheckpointManager(tmp_path, rank=0, world_size=2).save(2, contents)
    names = {p.name for p in (tmp_path / "checkpoint-2").iterdir()}
    assert "rng_state_0.pth" in names and "rng_state.pth" not in names


def test_preemption_guard_sets_flag_and_restores_handler():
    calls = []

    def previous(signum, frame):
        calls.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with PreemptionGuard() as guard:
            assert guard.active and not guard.requested
            os.kill(os.getpid(), signal.SIGTERM)
            assert guard.requested and guard.signal_name == "SIGTERM"
            with pytest.raises(KeyboardInterrupt):  # Ctrl-C while a stop is pending forces the exit
                os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) is previous and calls == []
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_preemption_guard_is_noop_outside_main_thread():
    seen = {}

    def run() -> None:
        with PreemptionGuard() as guard:
            seen["active"] = guard.active
            seen["handler"] = signal.getsignal(signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"active": False, "handler": before}


class Held:
    """A per-rank part (as the training loader's look-ahead): a state dict of this rank's own, possibly empty."""

    def __init__(self, state: dict | None = None) -> None:
        self.state = state or {}
        self.loads: list[dict] = []

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.loads.append(state)
        self.state = dict(state)


def test_rank_parts_go_into_this_ranks_rng_file_and_come_back(tmp_path):
    from trainwell.checkpoint.rng import read_rng_file

    manager = CheckpointManager(tmp_path)
    src = _setup(0)
    src.rank_parts = {"trainwell_held": Held({"cpu": torch.arange(3)}), "trainwell_empty": Held()}
    folder = manager.save(1, src)
    saved = read_rng_file(folder / "rng_state.pth")
    assert torch.equal(saved["trainwell_held"]["cpu"], torch.arange(3))
    assert "trainwell_empty" not in saved  # an empty state is not written
    dst = _setup(1, steps=0)
    dst.rank_parts = {"trainwell_held": Held(), "trainwell_empty": Held({"stale": 1})}
    manager.load(folder, dst)
    assert torch.equal(dst.rank_parts["trainwell_held"].state["cpu"], torch.arange(3))
    assert dst.rank_parts["trainwell_empty"].loads == [{}]  # none saved: loaded empty


def test_rank_parts_are_not_saved_with_save_only_model_and_may_not_shadow_the_random_states(tmp_path):
    manager = CheckpointManager(tmp_path)
    src = _setup(0)
    src.save_only_model, src.rank_parts = True, {"trainwell_held": Held({"a": 1})}
    folder = manager.save(1, src)
    assert not (folder / "rng_state.pth").exists()
    src = _setup(0)
    src.rank_parts = {"cpu": Held({"a": 1})}
    with pytest.raises(ValueError, match="'cpu'"):
        manager.save(2, src)


def test_a_resized_job_loads_the_rank_parts_of_the_rng_file_it_restores(tmp_path):
    src = _setup(0)
    src.rank_parts = {"trainwell_held": Held({"from": 0})}
    folder = CheckpointManager(tmp_path).save(1, src)  # one process: rng_state.pth
    dst = _setup(1, steps=0)
    dst.rank_parts = {"trainwell_held": Held()}
    CheckpointManager(tmp_path, rank=1, world_size=2, should_save=False).load(folder, dst)
    assert dst.rank_parts["trainwell_held"].state == {"from": 0}  # the saving rank's, with its random streams


def test_an_async_save_writes_the_rank_parts_as_they_were_when_it_was_asked(tmp_path):
    from trainwell.checkpoint.async_save import AsyncSaver
    from trainwell.checkpoint.rng import read_rng_file

    manager, saver = CheckpointManager(tmp_path), AsyncSaver()
    src = _setup(0)
    part = Held({"step": torch.tensor([1])})
    src.rank_parts = {"trainwell_held": part}
    folder = saver.save(manager, 1, src)
    part.state["step"].add_(1)  # the loop moves on while the save is written (in place, the worst case)
    part.state = {"step": torch.tensor([5])}
    saver.wait()
    assert torch.equal(read_rng_file(folder / "rng_state.pth")["trainwell_held"]["step"], torch.tensor([1]))
