"""A process group that trainwell created is closed at exit; one the script created is left to the script.

Without the close, gloo's worker threads are torn down during interpreter finalization and a rank can abort with
"terminate called without an active exception" after a run that succeeded. The job registers its own ``atexit``
check *before* the Trainer exists; ``atexit`` runs handlers last-registered-first, so the check sees the state after
trainwell's handler ran. A rank leaving on an unhandled exception signs off at once instead of waiting for peers that
may be blocked in a collective. At exit no gloo thread is left either, although FSDP2's mesh, DeepSpeed's engine and
torch itself still reference the destroyed groups. torchrun runs this file as the job
(``python test_exit_teardown.py OUT MODE``).
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

pytestmark = [pytest.mark.distributed, pytest.mark.slow]



class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        return {"loss": nn.functional.mse_loss(self.lin(x).squeeze(-1), labels)}


def _job(out: str, mode: str) -> None:
    import torch.distributed as dist

    from trainwell import Trainer, TrainingArguments

    rank = int(os.environ["RANK"])

    def report() -> None:  # runs after trainwell's handler (registered later, so run earlier)
        Path(f"{out}.{rank}").write_text("open" if dist.is_initialized() else "closed")
        if dist.is_initialized():  # the script's own group: the script closes it
            dist.barrier()
            dist.destroy_process_group()

    if mode == "threads":
        return _threads_job(out, rank)
    atexit.register(report)
    if mode == "user":
        dist.init_process_group("gloo")
    data = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i % 3))} for i in range(8)]
    args = TrainingArguments(output_dir=os.path.join(os.path.dirname(out), "run"), max_steps=2,
                             per_device_train_batch_size=2, save_strategy="no", report_to="none", disable_tqdm=True,
                             use_cpu=True)
    Trainer(model=Net(), args=args, train_dataset=data).train()
    if mode == "raises":
        import trainwell.runtime.distributed

        trainwell.runtime.distributed._EXIT_BARRIER_TIMEOUT_S = 10.0 ** 6  # waiting for the blocked peer would hang
        if rank == 1:
            raise RuntimeError("rank 1 fails after training")
        dist.barrier()  # rank 0 waits for a peer that never comes, until the launcher stops it


def _gloo_threads() -> list[str]:
    """The names of this process's native threads that belong to gloo process groups (Linux: ``/proc``)."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return sorted(name for name in names if name in ("pt_gloo_runloop", "gloo_tcp_loop"))


def _threads_job(out: str, rank: int) -> None:
    """DeepSpeed ZeRO-3, FSDP2 and DDP in one launch, their Trainers kept alive to the end (as a script's globals
    are): the mesh, the engine, DeepSpeed's own module state and DDP's C++ reducer still reference process groups
    when the script ends."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch.distributed as dist
    from jobs import backend_args

    from trainwell import Trainer, TrainingArguments

    atexit.register(lambda: Path(f"{out}.{rank}").write_text(json.dumps(_gloo_threads())))
    data = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i % 3))} for i in range(8)]
    for name in ("zero3", "fsdp", "ddp"):  # ZeRO-3 first: its Trainer makes the group (through accelerate, when loaded)
        args = TrainingArguments(output_dir=os.path.join(os.path.dirname(out), name), max_steps=1,
                                 per_device_train_batch_size=2, save_strategy="no", report_to="none",
                                 disable_tqdm=True, use_cpu=True, **backend_args(name))
        trainer = Trainer(model=Net(), args=args, train_dataset=data)
        trainer.train()
        _kept.append(trainer)
    dist.barrier()  # the script closes the group itself (as tests/distributed/jobs.py::finish): the handler still
    dist.destroy_process_group()  # has to free what references it


_kept: list = []  # the Trainers, alive until the interpreter finalizes


@pytest.mark.parametrize("mode", ["trainwell", "user"])
def test_process_group_is_closed_at_exit_only_when_trainwell_created_it(tmp_path, mode):
    from helpers.launch import run, torchrun  # here: the job (this file) runs without tests/ on sys.path

    out = tmp_path / "state"
    run(torchrun(Path(__file__).resolve(), out, mode), "the 2-rank job", timeout=300)
    expected = "closed" if mode == "trainwell" else "open"
    assert [Path(f"{out}.{r}").read_text() for r in (0, 1)] == [expected, expected]


def test_a_rank_leaving_on_an_exception_closes_its_group_without_waiting_for_blocked_peers(tmp_path):
    from helpers.launch import run, torchrun

    out = tmp_path / "state"
    done = run(torchrun(Path(__file__).resolve(), out, "raises"), "the 2-rank job", timeout=300, check=False)
    assert done.returncode != 0 and "rank 1 fails after training" in done.stdout, done.stdout[-3000:]
    assert Path(f"{out}.1").read_text() == "closed"


@pytest.mark.deepspeed
def test_no_gloo_thread_outlives_the_exit_handler_when_meshes_and_deepspeed_hold_groups(tmp_path):
    """FSDP2's mesh, DeepSpeed's engine and caches, DDP's reducer and torch's own ``group=group.WORLD`` defaults
    keep destroyed groups (and their threads) alive into interpreter finalization unless the exit handler drops
    them (4 ``pt_gloo_runloop`` + 2 ``gloo_tcp_loop`` threads per rank before)."""
    pytest.importorskip("deepspeed")
    import json

    from helpers.launch import child_env, run, torchrun

    out = tmp_path / "state"
    done = run(torchrun(Path(__file__).resolve(), out, "threads"), "the 2-rank job", timeout=300,
               env=child_env(DS_ACCELERATOR="cpu"))
    assert [json.loads(Path(f"{out}.{r}").read_text()) for r in (0, 1)] == [[], []]
    # looking through torch.distributed's names at exit touched a deprecated alias: a FutureWarning on every rank
    assert "reduce_op` is deprecated" not in done.stdout


if __name__ == "__main__":
    _job(sys.argv[1], sys.argv[2])
