"""An incomplete launch environment fails at once; a rendezvous waiting for peers says so while it waits."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from trainwell.runtime.distributed import LaunchEnv, RendezvousWatch, check_rendezvous_env

VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS",
        "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
# What a user's script does: build the arguments and a Trainer (the process group is created there).
SCRIPT = """
import torch
from torch import nn
from trainwell import Trainer, TrainingArguments

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(2, 1)
    def forward(self, x, labels=None):
        return {"loss": self.l(x).pow(2).mean()}

args = TrainingArguments(output_dir=sys.argv[1], report_to=[], use_cpu=True, ddp_timeout=600)
Trainer(model=M(), args=args, train_dataset=[{"x": torch.ones(2)}] * 4)
print("BUILT")
"""


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_world_size_without_master_addr_is_refused_naming_the_variables_and_the_fix(env):
    env.setenv("WORLD_SIZE", "2")
    env.setenv("RANK", "0")
    env.setenv("LOCAL_RANK", "0")
    with pytest.raises(RuntimeError) as err:
        check_rendezvous_env(LaunchEnv(rank=0, world_size=2, local_rank=0))
    message = str(err.value)
    for part in ("WORLD_SIZE=2", "RANK=0", "MASTER_ADDR is not set", "torchrun --nproc_per_node=2",
                 "unset WORLD_SIZE, RANK and LOCAL_RANK"):
        assert part in message


def test_complete_or_implied_environments_pass(env):
    check_rendezvous_env(LaunchEnv(rank=0, world_size=1, local_rank=0))  # the notebook emulation: no peers
    env.setenv("OMPI_COMM_WORLD_SIZE", "2")
    env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")  # mpirun on one node: 127.0.0.1 is right
    check_rendezvous_env(LaunchEnv(rank=1, world_size=2, local_rank=1))
    env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "1")  # mpirun on two nodes: where is rank 0?
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        check_rendezvous_env(LaunchEnv(rank=1, world_size=2, local_rank=0))
    env.setenv("MASTER_ADDR", "node1")
    check_rendezvous_env(LaunchEnv(rank=1, world_size=2, local_rank=0))


def test_the_watch_names_address_missing_rank_and_timeout(env):
    env.setenv("MASTER_ADDR", "10.0.0.7")
    env.setenv("MASTER_PORT", "29511")
    host = RendezvousWatch(LaunchEnv(rank=0, world_size=2, local_rank=0), 1800).message(5)
    assert host.startswith("trainwell: rank 0 hosts the rendezvous at 10.0.0.7:29511 and waits for rank 1")
    assert "5 s so far, giving up after 1800 s (ddp_timeout)" in host
    peer = RendezvousWatch(LaunchEnv(rank=3, world_size=4, local_rank=1), 60).message(35)
    assert peer.startswith("trainwell: rank 3 waits for rank 0 at 10.0.0.7:29511")
    assert "35 s so far, giving up after 60 s" in peer
    assert "ranks 1 to 3" in RendezvousWatch(LaunchEnv(rank=0, world_size=4, local_rank=0), 60).message(5)


def test_the_watch_keeps_reporting_while_it_waits_and_stops_after(env, capsys):
    seen = ""
    with RendezvousWatch(LaunchEnv(rank=1, world_size=2, local_rank=1), 60, first_s=0.01, every_s=0.01):
        deadline = time.monotonic() + 30  # a hang guard, not a timing assertion
        while seen.count("waits for rank 0") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
            seen += capsys.readouterr().err
    assert seen.count("trainwell: rank 1 waits for rank 0") >= 2
    capsys.readouterr()
    time.sleep(0.05)
    assert capsys.readouterr().err == ""  # silent once the group formed


@pytest.mark.slow
def test_a_leftover_world_size_fails_at_once_in_a_real_process(tmp_path):
    from helpers.launch import child_env, run

    env = child_env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    done = run([sys.executable, "-c", "import sys\n" + SCRIPT, tmp_path / "out"], "the script", timeout=120,
               env=env, check=False)
    assert done.returncode != 0 and "BUILT" not in done.stdout
    assert "MASTER_ADDR is not set" in done.stdout and "torchrun --nproc_per_node=2" in done.stdout


@pytest.mark.slow
def test_a_rendezvous_waiting_for_a_missing_rank_says_so(tmp_path):
    """Rank 0 of 2 started alone with a complete environment: it waits (legitimately) and says for whom."""
    from helpers.launch import _kill, child_env, free_port, start

    port = free_port()
    env = child_env(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    proc = start([sys.executable, "-c", "import sys\n" + SCRIPT, tmp_path / "out"], env=env)
    guard = threading.Timer(180, _kill, (proc,))  # never hang the suite if the report does not come
    guard.start()
    lines = [""]
    try:
        for line in proc.stdout:  # the first report comes about 5 s into the wait; the job waits up to 600 s
            lines.append(line)
            if "waits for rank 1" in line:
                break
    finally:
        guard.cancel()
        _kill(proc)
        proc.communicate()
    report = lines[-1]
    assert report.startswith(f"trainwell: rank 0 hosts the rendezvous at 127.0.0.1:{port} and waits for rank 1")
    assert "giving up after 600 s (ddp_timeout)" in report
