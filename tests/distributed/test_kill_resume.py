"""SIGKILL one of 2 ranks (DDP, FSDP2, DeepSpeed ZeRO-2 and ZeRO-3) at fixed points, inside every phase of the save
and between saves, relaunch with ``resume_from_checkpoint=True`` each time: the run ends with the weights of the
uninterrupted run.

Each backend runs a chain: a launch killed at the first point, a relaunch (resuming) killed at the next one, ..., and
a last relaunch that finishes. The save-phase kills use trainwell's test hook ``TRAINWELL_TEST_KILL_AT`` (see
``trainwell/checkpoint/commit.py``); the others ``kill_job.py`` (a callback between saves, a wrapper of DeepSpeed's
checkpoint engine inside ``engine.save_checkpoint``). After every kill each complete
checkpoint is checked: its marker lists every rank's RNG file and the engine's files, and every file matches its
recorded size and checksum. The comparison is ``torch.equal``: on the CPU every backend resumes bit for bit
(DeepSpeed included: its optimizer state, loss scale and schedule come from its own checkpoint, and the data order
and the RNG streams from trainwell's), so a silently fresh optimizer or a lost RNG stream fails the test. ZeRO-3
also compares the consolidated fp32 weights of the last checkpoint's ZeRO shards.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, start, torchrun, wait
from helpers.tensors import final_weights

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.deepspeed]

JOB = Path(__file__).with_name("kill_job.py")
TIMEOUT_S = 400

KILL_AT = "TRAINWELL_TEST_KILL_AT"
IN_ENGINE = "KILL_JOB_IN_ENGINE_SAVE"  # inside DeepSpeed's engine.save_checkpoint, after the named file (kill_job.py)
# (environment variable, value) per kill; the value ends with the killed rank. Phases: files, engine, marker, rename,
# renamed (commit.py's docstring); rename and renamed run on the saving rank (0) only.
CHAINS = {
    "ddp": [("KILL_JOB_AT_STEP", "4:1"), (KILL_AT, "files:6:1"), (KILL_AT, "rename:9:0")],
    # every phase on every rank that runs it (files, engine, marker: both ranks; rename, renamed: rank 0), e.g. one
    # rank dies before DCP's save while the other is inside it, or the marker is written but not renamed into place
    "fsdp": [(KILL_AT, "files:3:0"), (KILL_AT, "files:3:1"), (KILL_AT, "rename:3:0"), (KILL_AT, "engine:6:1"),
             (KILL_AT, "renamed:6:0"), (KILL_AT, "engine:9:0"), (KILL_AT, "marker:9:1"), (KILL_AT, "marker:12:0")],
    # rank 1 dies before its engine files while rank 0 is inside engine.save_checkpoint (the old 'latest' bug)
    "zero2": [(KILL_AT, "files:3:1"), (KILL_AT, "renamed:6:0"), (KILL_AT, "marker:9:0")],
    # ZeRO-3 (sharded parameters): inside DeepSpeed's own write, rank 1 with its model states written but not its
    # optimizer shard (rank 0 writes 'latest' meanwhile), rank 0 with its shard written but not 'latest'; then in
    # trainwell's files, before the rename, before the marker
    "zero3": [(IN_ENGINE, "model_states:3:1"), (IN_ENGINE, "optim_states:3:0"), (KILL_AT, "files:6:0"),
              (KILL_AT, "rename:9:0"), (KILL_AT, "marker:12:1")],
}
# the engine's files each complete checkpoint-<step> must list ({step}: its step)
ZERO3_SHARDS = [f"global_step{{step}}/zero_pp_rank_{r}_mp_rank_00_{kind}_states.pt"
                for r in (0, 1) for kind in ("model", "optim")]
ENGINE_FILES = {"ddp": [], "fsdp": ["fsdp_state/.metadata"], "zero2": ["latest"], "zero3": ["latest", *ZERO3_SHARDS]}


def _launch(out: Path, backend: str, kill: tuple[str, str] | None,
            extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return wait(_start(out, backend, kill, extra_env), f"{backend} {kill}", timeout=TIMEOUT_S, check=False)


def _start(out: Path, backend: str, kill: tuple[str, str] | None,
           extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = child_env(drop=[k for k in os.environ if k.startswith("KILL_JOB_")] + [KILL_AT], DS_ACCELERATOR="cpu")
    if kill is not None:
        env[kill[0]] = kill[1]
    env.update(extra_env or {})
    return start(torchrun(JOB, out, backend), env=env, merge=False)


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
        step = folder.name.rsplit("-", 1)[1]
        for name in ["rng_state_0.pth", "rng_state_1.pth", "model.safetensors", *ENGINE_FILES[backend]]:
            assert name.format(step=step) in listed, f"{folder}: {name.format(step=step)} missing from the marker"
        manager.verify(folder)  # sizes, checksums, pickle allow-list
    unmarked = [p for p in out.iterdir() if is_checkpoint_name(p.name) is not None
                and p not in list_complete_checkpoints(out)]
    assert unmarked == [], unmarked  # a kill leaves at most a .tmp- folder, never an unmarked checkpoint-*


def _check_partial_engine_folder(out: Path, spec: str) -> None:
    """A kill inside DeepSpeed's write (``<file>:<step>:<rank>``) left the temporary folder with that rank's file
    but without the marker (so no relaunch uses it), and without ``latest`` when rank 0 (its writer) died."""
    from trainwell.checkpoint.layout import COMPLETE_MARKER

    name, step, rank = spec.split(":")
    folders = [p for p in out.glob(f".tmp-checkpoint-{step}-*")
               if (p / f"global_step{step}" / f"zero_pp_rank_{rank}_mp_rank_00_{name}.pt").is_file()]
    assert len(folders) == 1, sorted(p.name for p in out.iterdir())
    assert not (folders[0] / COMPLETE_MARKER).exists()
    assert rank != "0" or not (folders[0] / "latest").exists()


@pytest.mark.parametrize("backend", list(CHAINS))
def test_killed_ranks_resume_to_the_uninterrupted_weights(backend, tmp_path):
    if backend in ("zero2", "zero3"):
        pytest.importorskip("deepspeed")
    reference = _start(tmp_path / "reference", backend, None)  # runs beside the first killed launch
    out = tmp_path / "killed"
    for i, kill in enumerate(CHAINS[backend]):
        allowed = _resume_steps(out)
        proc = _launch(out, backend, kill)
        log = proc.stdout + proc.stderr
        (tmp_path / f"launch-{i}.log").write_text(log)  # for a post-mortem of a failure
        killed_rank = kill[1].rsplit(":", 1)[1]
        # the intended rank died of its SIGKILL (not of a crash at resume: that would be a crash loop)
        assert proc.returncode != 0 and f"(exitcode: -9) local_rank: {killed_rank}" in log, f"{kill}:\n{log[-4000:]}"
        begin = _begin_steps(log)
        assert begin.keys() == {0, 1} and len(set(begin.values())) == 1, begin  # both ranks, the same checkpoint
        assert begin[0] in allowed, (kill, begin, allowed)
        assert not (out / "final.safetensors").exists()
        _check_checkpoints(out, backend)
        if kill[0] == IN_ENGINE:
            _check_partial_engine_folder(out, kill[1])
    wait(reference, f"the uninterrupted {backend} run", timeout=TIMEOUT_S)
    allowed = _resume_steps(out)
    final = _launch(out, backend, None)
    assert final.returncode == 0, final.stderr[-6000:]
    log = final.stdout + final.stderr
    begin = _begin_steps(log)
    assert begin.keys() == {0, 1} and len(set(begin.values())) == 1 and begin[0] in allowed - {0}, (begin, allowed)
    assert "start fresh" not in log and "not restored" not in log
    want, got = final_weights(tmp_path / "reference"), final_weights(out)
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    if backend == "zero3":  # and the fp32 master weights DeepSpeed's last checkpoint holds, consolidated
        from trainwell.backends.deepspeed import get_fp32_state_dict_from_zero_checkpoint

        want, got = (get_fp32_state_dict_from_zero_checkpoint(run / "checkpoint-12")
                     for run in (tmp_path / "reference", out))
        assert sorted(got) == sorted(want) == sorted(final_weights(out))
        for name, tensor in want.items():
            assert tensor.dtype == torch.float32 and torch.equal(got[name], tensor), name


def test_every_rank_resumes_from_the_save_promoted_at_start(tmp_path):
    """A save killed between its marker and its rename is the only checkpoint; at the next ``train()`` the saving
    rank promotes it into place (slowly here: ``KILL_JOB_SLOW_CLEANUP``) while the other rank decides where to
    resume (``resume_from_checkpoint="auto"``): both must wait for the promotion and resume from it (before the
    fix rank 1 started from scratch while rank 0 resumed, and the two hung in mismatched collectives)."""
    out = tmp_path / "out"
    killed = _launch(out, "ddp", (KILL_AT, "rename:3:0"))
    assert killed.returncode != 0 and "(exitcode: -9) local_rank: 0" in killed.stdout + killed.stderr
    assert _resume_steps(out) == {0, 3} and not list(out.glob("checkpoint-*"))
    final = _launch(out, "ddp", None, {"KILL_JOB_RESUME": "auto", "KILL_JOB_SLOW_CLEANUP": "3"})
    log = final.stdout + final.stderr
    assert final.returncode == 0, log[-6000:]
    assert _begin_steps(log) == {0: 3, 1: 3}, log[-6000:]
    assert (out / "final.safetensors").is_file() and [p.name for p in out.glob(".tmp-*")] == []
