"""SIGKILL one of 2 ranks (DDP, FSDP2, DeepSpeed ZeRO-2) at fixed points, inside every phase of the save and between
saves, relaunch with ``resume_from_checkpoint=True`` each time: the run ends with the weights of the uninterrupted run.

Each backend runs a chain: a launch killed at the first point, a relaunch (resuming) killed at the next one, ..., and
a last relaunch that finishes. The save-phase kills use trainwell's test hook ``TRAINWELL_TEST_KILL_AT`` (see
``trainwell/checkpoint/commit.py``); the others a callback of ``kill_job.py``. After every kill each complete
checkpoint is checked: its marker lists every rank's RNG file and the engine's files, and every file matches its
recorded size and checksum. The comparison is ``torch.equal``: on the CPU every backend resumes bit for bit
(DeepSpeed included: its optimizer state, loss scale and schedule come from its own checkpoint, and the data order
and the RNG streams from trainwell's), so a silently fresh optimizer or a lost RNG stream fails the test.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from launch import child_env, start, torchrun, wait

pytestmark = pytest.mark.distributed

JOB = Path(__file__).with_name("kill_job.py")
TIMEOUT_S = 400

# (environment variable, value) per kill; phases: files, engine, marker, rename, renamed (commit.py's docstring).
CHAINS = {
    "ddp": [("KILL_JOB_AT_STEP", "4:1"), ("TRAINWELL_TEST_KILL_AT", "files:6:1"),
            ("TRAINWELL_TEST_KILL_AT", "rename:9:0")],
    "fsdp": [("TRAINWELL_TEST_KILL_AT", "engine:6:1"), ("TRAINWELL_TEST_KILL_AT", "marker:9:1")],
    # rank 1 dies before its engine files while rank 0 is inside engine.save_checkpoint (the old 'latest' bug)
    "zero2": [("TRAINWELL_TEST_KILL_AT", "files:3:1"), ("TRAINWELL_TEST_KILL_AT", "renamed:6:0"),
              ("TRAINWELL_TEST_KILL_AT", "marker:9:0")],
}
ENGINE_FILES = {"ddp": [], "fsdp": ["fsdp_state/.metadata"], "zero2": ["latest"]}


def _launch(out: Path, backend: str, kill: tuple[str, str] | None) -> subprocess.CompletedProcess:
    return wait(_start(out, backend, kill), f"{backend} {kill}", timeout=TIMEOUT_S, check=False)


def _start(out: Path, backend: str, kill: tuple[str, str] | None) -> subprocess.Popen:
    env = child_env(drop=("KILL_JOB_AT_STEP", "TRAINWELL_TEST_KILL_AT"), DS_ACCELERATOR="cpu")
    if kill is not None:
        env[kill[0]] = kill[1]
    return start(torchrun(JOB, out, backend), env=env, merge=False)


def _weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "final.safetensors"))


def _resume_steps(out: Path) -> set[int]:
    """The steps a relaunch may resume at: the newest complete checkpoint's (0: none), or that of a temporary
    folder whose marker was written before the kill (discovery may promote it, as after an interrupted rename)."""
    import re

    from trainwell.checkpoint.layout import COMPLETE_MARKER, list_complete_checkpoints

    complete = [int(p.name.rsplit("-", 1)[1]) for p in list_complete_checkpoints(out)] if out.is_dir() else []
    newest = max(complete, default=0)
    marked_tmp = [int(m.group(1)) for p in (out.iterdir() if out.is_dir() else [])
                  if (m := re.match(r"^\.tmp-checkpoint-(\d+)-\d+$", p.name)) and (p / COMPLETE_MARKER).is_file()]
    return {newest, max([newest, *marked_tmp])}


def _begin_steps(log: str) -> dict[int, int]:
    import re

    return {int(r): int(step) for r, step in re.findall(r"RANK(\d) BEGIN_STEP (\d+)", log)}


def _check_checkpoints(out: Path, backend: str) -> None:
    from trainwell.checkpoint.layout import list_complete_checkpoints, marker_files
    from trainwell.checkpoint.manager import CheckpointManager
    from trainwell.trainer_utils import is_checkpoint_name

    manager = CheckpointManager(out)
    for folder in list_complete_checkpoints(out):
        listed = marker_files(folder)
        for name in ["rng_state_0.pth", "rng_state_1.pth", "model.safetensors", *ENGINE_FILES[backend]]:
            assert name in listed, f"{folder}: {name} missing from the marker"
        manager.verify(folder)  # sizes, checksums, pickle allow-list
    unmarked = [p for p in out.iterdir() if is_checkpoint_name(p.name) is not None
                and p not in list_complete_checkpoints(out)]
    assert unmarked == [], unmarked  # a kill leaves at most a .tmp- folder, never an unmarked checkpoint-*


@pytest.mark.parametrize("backend", list(CHAINS))
def test_killed_ranks_resume_to_the_uninterrupted_weights(backend, tmp_path):
    if backend == "zero2":
        pytest.importorskip("deepspeed")
    reference = _start(tmp_path / "reference", backend, None)  # runs beside the first killed launch
    out = tmp_path / "killed"
    for kill in CHAINS[backend]:
        allowed = _resume_steps(out)
        proc = _launch(out, backend, kill)
        log = proc.stdout + proc.stderr
        killed_rank = kill[1].rsplit(":", 1)[1]
        # the intended rank died of its SIGKILL (not of a crash at resume: that would be a crash loop)
        assert proc.returncode != 0 and f"(exitcode: -9) local_rank: {killed_rank}" in log, f"{kill}:\n{log[-4000:]}"
        begin = _begin_steps(log)
        assert begin.keys() == {0, 1} and len(set(begin.values())) == 1, begin  # both ranks, the same checkpoint
        assert begin[0] in allowed, (kill, begin, allowed)
        assert not (out / "final.safetensors").exists()
        _check_checkpoints(out, backend)
    wait(reference, f"the uninterrupted {backend} run", timeout=TIMEOUT_S)
    allowed = _resume_steps(out)
    final = _launch(out, backend, None)
    assert final.returncode == 0, final.stderr[-6000:]
    log = final.stdout + final.stderr
    begin = _begin_steps(log)
    assert begin.keys() == {0, 1} and len(set(begin.values())) == 1 and begin[0] in allowed - {0}, (begin, allowed)
    assert "start fresh" not in log and "not restored" not in log
    want, got = _weights(tmp_path / "reference"), _weights(out)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
