"""async_save=True: training blocks only for the copy to host memory; the commit protocol runs in the background.

The files are the same bytes as a synchronous save's, a SIGKILL during the background write leaves the previous
checkpoint the newest valid one (the resume is bit-exact), a failure of the background write is raised in the
training thread at the next step, and the final save is committed before ``train()`` returns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainerCallback, TrainingArguments
from trainwell.checkpoint.async_save import HostCopier
from trainwell.checkpoint.layout import CheckpointError, list_complete_checkpoints, read_marker, verify_checkpoint
from helpers.launch import ROOT, free_port
from helpers.tensors import final_weights

REPO = ROOT

JOB = textwrap.dedent('''
    import sys
    from pathlib import Path
    import torch
    from torch import nn
    from safetensors.torch import save_file
    from trainwell import Trainer, TrainingArguments

    out, async_save, resume = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.drop, self.b = nn.Linear(6, 16), nn.Dropout(0.3), nn.Linear(16, 1)

        def forward(self, x, labels):
            pred = self.b(self.drop(torch.relu(self.a(x)))).squeeze(-1)
            return {"loss": ((pred - labels) ** 2).mean()}

    gen = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(6, generator=gen), "labels": torch.randn((), generator=gen)} for _ in range(40)]
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=8, save_steps=2,
                             learning_rate=0.05, report_to="none", use_cpu=True, disable_tqdm=True,
                             async_save=async_save, logging_steps=1)
    torch.manual_seed(1)
    trainer = Trainer(model=Net(), args=args, train_dataset=data)
    trainer.train(resume_from_checkpoint=True if resume else None)
    save_file({k: v.contiguous() for k, v in trainer.model.state_dict().items()}, str(out / "final.safetensors"))
''')


def _run(tmp_path: Path, out: Path, async_save: bool, resume: bool, kill_at: str | None = None):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("TRAINWELL_TEST_KILL_AT", None)
    if kill_at:
        env["TRAINWELL_TEST_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, str(script), str(out), str(int(async_save)), str(int(resume))],
                          env=env, capture_output=True, text=True, timeout=300)


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert type(a) is type(b) and list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif hasattr(a, "dtype") and hasattr(a, "shape"):  # numpy arrays in the RNG state
        assert (a == b).all()
    else:
        assert a == b


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted synchronous run and one asynchronous run."""
    root = tmp_path_factory.mktemp("async_ref")
    runs = {}
    for name, flag in (("sync", False), ("async", True)):
        proc = _run(root, root / name, flag, resume=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = root / name
    return runs


@pytest.mark.slow
def test_async_checkpoints_hold_the_same_bytes_as_sync(reference):
    sync, async_ = reference["sync"], reference["async"]
    assert [p.name for p in list_complete_checkpoints(async_)] == [p.name for p in list_complete_checkpoints(sync)] \
        == [f"checkpoint-{s}" for s in (2, 4, 6, 8)]
    for step in (2, 4, 6, 8):
        a, s = async_ / f"checkpoint-{step}", sync / f"checkpoint-{step}"
        verify_checkpoint(a)
        files_a, files_s = read_marker(a)["files"], read_marker(s)["files"]
        for name in ("model.safetensors", "data_state.json", "trainer_state.json"):
            assert files_a[name] == files_s[name], (step, name)  # size and checksum
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):  # torch.save stamps a serialization id
            assert files_a[name]["size"] == files_s[name]["size"], (step, name)
            _assert_same(torch.load(a / name, weights_only=False), torch.load(s / name, weights_only=False))
    for key, value in final_weights(sync).items():
        assert torch.equal(value, final_weights(async_)[key])


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["files", "rename"])
def test_a_kill_during_the_background_write_resumes_from_the_previous_checkpoint(reference, tmp_path, phase):
    out = tmp_path / "out"
    killed = _run(tmp_path, out, True, resume=False, kill_at=f"{phase}:4:0")
    assert killed.returncode == -9, killed.stderr[-3000:]
    complete = [p.name for p in list_complete_checkpoints(out)]
    assert "checkpoint-4" not in complete and complete[-1] == "checkpoint-2"
    resumed = _run(tmp_path, out, True, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # phase "files": the temporary folder is removed; "rename": it is complete (marked) and is renamed into place
    assert ".tmp-checkpoint-4" in resumed.stderr
    expected = final_weights(reference["sync"])
    for key, value in final_weights(out).items():
        assert torch.equal(value, expected[key]), key
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-")]


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 1)

    def forward(self, x, labels):
        return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).mean()}


def _data(n: int = 16) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [{"x": torch.randn(3, generator=gen), "labels": torch.randn((), generator=gen)} for _ in range(n)]


class _BrokenDisk:
    """A processing class whose save_pretrained fails (as a full disk would), in the background write."""

    def save_pretrained(self, folder):
        raise OSError(28, "No space left on device (test)")


class _SaveDone(TrainerCallback):
    """Lets the background save of ``step`` finish before the next step (so the test knows which step raises)."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer, self.steps_begun = step, None, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.steps_begun.append(state.global_step + 1)
        if state.global_step == self.step:
            self.trainer._tw_checkpoints.async_saver.join()


def test_a_failed_background_write_is_raised_at_the_next_step(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=6, save_steps=2,
                             report_to="none", use_cpu=True, disable_tqdm=True, async_save=True)
    sync = _SaveDone(2)
    trainer = Trainer(model=_Net(), args=args, train_dataset=_data(), processing_class=_BrokenDisk(),
                      callbacks=[sync])
    sync.trainer = trainer
    with pytest.raises(CheckpointError, match=r"^no space left on the disk .* writing checkpoint-2 .*No space left on "
                                              r"device.*\(the background save of checkpoint-2, async_save=True\)"):
        trainer.train()
    assert trainer.state.global_step == 3 and sync.steps_begun == [1, 2, 3]  # raised right after step 3
    assert sorted(p.name for p in tmp_path.iterdir() if "checkpoint" in p.name) == []  # no half checkpoint


def test_the_final_save_is_committed_before_train_returns(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=4, save_steps=2,
                             save_total_limit=1, report_to="none", use_cpu=True, disable_tqdm=True, async_save=True)
    trainer = Trainer(model=_Net(), args=args, train_dataset=_data())
    trainer.train()
    assert not trainer._tw_checkpoints.async_saver.busy
    assert [p.name for p in list_complete_checkpoints(tmp_path)] == ["checkpoint-4"]  # committed and rotated
    verify_checkpoint(tmp_path / "checkpoint-4")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_host_copier_keeps_shared_storage_reuses_buffers_and_copies_the_values():
    base = torch.arange(12.0)
    state = OrderedDict(w=base.view(3, 4), tied=base.view(3, 4), tail=base[6:], t=base.view(4, 3).t(),
                        other=(torch.ones(2), [torch.zeros(3, dtype=torch.int64)]), n=5, s="x")
    copier = HostCopier()
    first = copier.copy(state)
    assert type(first) is OrderedDict and first["n"] == 5 and first["s"] == "x"
    for key in ("w", "tied", "tail", "t"):
        assert torch.equal(first[key], state[key]) and first[key].stride() == state[key].stride()
    assert first["w"].untyped_storage().data_ptr() == first["tied"].untyped_storage().data_ptr() \
        == first["tail"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    assert torch.equal(first["other"][1][0], torch.zeros(3, dtype=torch.int64))
    assert copier.nbytes == 12 * 4 + 2 * 4 + 3 * 8
    pointer = first["w"].untyped_storage().data_ptr()
    base.add_(1)  # the live state moves on; the copy does not
    assert first["w"][0, 0].item() == 0.0
    second = copier.copy(state)
    assert second["w"].untyped_storage().data_ptr() == pointer  # the same host buffer, reused
    assert second["w"][0, 0].item() == 1.0


REFUSED = textwrap.dedent('''
    import sys
    sys.path.insert(0, sys.argv[2])
    from deepspeed_job import make_trainer, zero
    try:
        make_trainer(sys.argv[1], zero(2), async_save=True, save_strategy="steps", save_steps=1)
    except ValueError as err:
        print("REFUSED", err)
''')


@pytest.mark.slow
def test_async_save_is_refused_with_an_engine_that_writes_its_own_files(tmp_path):
    script = tmp_path / "refused.py"
    script.write_text(REFUSED)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), str(REPO / "tests" / "distributed")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED async_save=True is not supported by the DeepSpeedBackend backend" in proc.stdout
    assert "DeepSpeed's save_checkpoint" in proc.stdout and "set async_save=False" in proc.stdout


