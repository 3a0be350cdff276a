"""Launcher environments, backend choice and the evaluation shard sampler (one process, no process group)."""

from __future__ import annotations

import logging

import pytest
import torch

from trainwell.data.samplers import EvalShardSampler
from trainwell.runtime.distributed import LaunchEnv, first_slurm_host, read_launch_env

ALL_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE",
            "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST",
            "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """A clean environment with none of the launchers' variables."""
    for name in ALL_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_launcher(env: pytest.MonkeyPatch) -> None:
    assert read_launch_env() == LaunchEnv()
    assert not read_launch_env().distributed


def test_torchrun(env: pytest.MonkeyPatch) -> None:
    for name, value in dict(RANK="5", WORLD_SIZE="8", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4").items():
        env.setenv(name, value)
    assert read_launch_env() == LaunchEnv(rank=5, world_size=8, local_rank=1, local_world_size=4)


def test_deepspeed_launcher_local_size_and_argument(env: pytest.MonkeyPatch) -> None:
    for name, value in dict(RANK="3", WORLD_SIZE="4", LOCAL_SIZE="2").items():
        env.setenv(name, value)
    # deepspeed also passes --local_rank; without LOCAL_RANK in the environment the argument is used
    assert read_launch_env(local_rank_arg=1) == LaunchEnv(rank=3, world_size=4, local_rank=1, local_world_size=2)
    env.setenv("LOCAL_RANK", "1")
    assert read_launch_env(local_rank_arg=0).local_rank == 1  # the environment wins


def test_legacy_launch_with_only_local_rank(env: pytest.MonkeyPatch) -> None:
    found = read_launch_env(local_rank_arg=0)
    assert found.distributed and found.world_size == 1 and found.rank == 0


def test_notebook_emulation_is_one_process(env: pytest.MonkeyPatch) -> None:
    for name, value in dict(MASTER_ADDR="localhost", MASTER_PORT="9994", RANK="0", LOCAL_RANK="0",
                            WORLD_SIZE="1").items():
        env.setenv(name, value)
    found = read_launch_env()
    assert found.distributed and found.world_size == 1


def test_rank_without_local_rank_derives_it(env: pytest.MonkeyPatch) -> None:
    for name, value in dict(RANK="6", WORLD_SIZE="8", LOCAL_WORLD_SIZE="4").items():
        env.setenv(name, value)
    assert read_launch_env().local_rank == 2


def test_srun_without_torchrun(env: pytest.MonkeyPatch) -> None:
    for name, value in dict(SLURM_PROCID="3", SLURM_STEP_NUM_TASKS="4", SLURM_NTASKS="4", SLURM_LOCALID="1",
                            SLURM_STEP_TASKS_PER_NODE="2(x2)", SLURM_JOB_NODELIST="gpu[07-08]").items():
        env.setenv(name, value)
    assert read_launch_env() == LaunchEnv(rank=3, world_size=4, local_rank=1, local_world_size=2)
    import os

    assert os.environ["MASTER_ADDR"] == "gpu07"


def test_sbatch_script_itself_is_not_a_process_group(env: pytest.MonkeyPatch) -> None:
    """The batch script has SLURM_PROCID and SLURM_NTASKS but is one process: waiting for 4 would hang."""
    env.setenv("SLURM_PROCID", "0")
    env.setenv("SLURM_NTASKS", "4")
    assert read_launch_env() == LaunchEnv()


def test_mpirun(env: pytest.MonkeyPatch) -> None:
    for name, value in dict(OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_RANK="2",
                            OMPI_COMM_WORLD_LOCAL_RANK="0").items():
        env.setenv(name, value)
    found = read_launch_env()
    assert (found.rank, found.world_size, found.local_rank) == (2, 4, 0)


def test_bad_value_names_the_variable(env: pytest.MonkeyPatch) -> None:
    env.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        read_launch_env()


@pytest.mark.parametrize("nodelist, first", [("node1", "node1"), ("gpu[03-05,09],cpu1", "gpu03"),
                                             ("a1,b[2-3]", "a1"), ("x[10]", "x10")])
def test_first_slurm_host(nodelist: str, first: str) -> None:
    assert first_slurm_host(nodelist) == first


def test_one_process_under_a_launcher_uses_the_single_backend(env: pytest.MonkeyPatch, tmp_path) -> None:
    from trainwell import TrainingArguments
    from trainwell.backends import build_backend
    from trainwell.backends.single import SingleDeviceBackend

    for name, value in dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1").items():
        env.setenv(name, value)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    backend = build_backend(args)
    assert type(backend) is SingleDeviceBackend
    assert not torch.distributed.is_initialized()
    assert args.world_size == 1 and args.parallel_mode.value == "distributed"


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, batch, replicas", [(13, 2, 2), (8, 2, 2), (1, 4, 3), (10, 3, 4), (37, 8, 2),
                                                (29, 4, 2), (7, 1, 2), (5, 8, 3)])
def test_eval_shard_sampler_gathers_back_to_dataset_order(n: int, batch: int, replicas: int,
                                                          drop_last: bool) -> None:
    from torch.utils.data import DataLoader

    samplers = [EvalShardSampler(n, batch_size=batch, num_replicas=replicas, rank=r, drop_last=drop_last)
                for r in range(replicas)]
    # what each rank's DataLoader yields, its placeholder batches dropped whole as the evaluation loop does
    loaders = [list(DataLoader(list(range(n)), batch_size=batch, sampler=s, drop_last=drop_last)) for s in samplers]
    assert len({len(batches) for batches in loaders}) == 1  # every rank runs the same number of batches
    evaluated = n // batch * batch if drop_last else n
    gathered, batches_seen = [], []
    for step in range(len(loaders[0])):
        for sampler, batches in zip(samplers, loaders):
            if step < sampler.num_real_batches:
                batches_seen.append(batches[step].tolist())
                gathered.extend(batches[step].tolist())
    assert gathered == list(range(evaluated))  # every sample once, in dataset order, no duplicate
    # each rank's batch is exactly one batch of a single-process evaluation
    single = [b.tolist() for b in DataLoader(list(range(n)), batch_size=batch, drop_last=drop_last)]
    assert batches_seen == single
    assert sum(s.num_real_samples for s in samplers) == evaluated
    assert all(sum(len(b) for b in batches[:s.num_real_batches]) == s.num_real_samples
               for s, batches in zip(samplers, loaders))
    assert all(len(s) == len(list(s)) for s in samplers)


@pytest.mark.parametrize("n, batch, replicas, drop_last", [(13, 2, 2, False), (29, 4, 3, False), (29, 4, 3, True),
                                                            (5, 8, 3, False)])
def test_eval_shard_sampler_gathers_back_to_a_given_order(n: int, batch: int, replicas: int, drop_last: bool) -> None:
    """``order`` (group_by_length's length-grouped evaluation order): each rank takes its shares of it, and the
    gathered real batches are the single-process batches of that order."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
    samplers = [EvalShardSampler(n, batch_size=batch, num_replicas=replicas, rank=r, drop_last=drop_last,
                                 order=order) for r in range(replicas)]
    loaders = [list(torch.utils.data.DataLoader(list(range(n)), batch_size=batch, sampler=s, drop_last=drop_last))
               for s in samplers]
    gathered = [i for step in range(len(loaders[0])) for sampler, batches in zip(samplers, loaders)
                if step < sampler.num_real_batches for i in batches[step].tolist()]
    assert gathered == order[:n // batch * batch if drop_last else n]
    with pytest.raises(ValueError, match="order has 2 indices"):
        EvalShardSampler(n, batch_size=batch, num_replicas=replicas, rank=0, order=[0, 1])


def test_group_by_length_evaluation_order_is_the_same_on_several_ranks() -> None:
    """Distributed, ``group_by_length`` evaluates in the single process's length-grouped order (gathered back)."""
    from types import SimpleNamespace

    from trainwell.trainer.dataloaders import eval_sampler

    data = [{"input_ids": [1] * (1 + (7 * i) % 11)} for i in range(21)]

    def args(world_size: int, rank: int = 0) -> SimpleNamespace:
        return SimpleNamespace(train_sampling_strategy="group_by_length", length_column_name="length", seed=3,
                               data_seed=None, eval_batch_size=2, world_size=world_size, process_index=rank,
                               dataloader_drop_last=False)

    single = list(eval_sampler(args(1), data))
    assert sorted(single) == list(range(21)) and single != list(range(21))
    ranks = [list(eval_sampler(args(2, r), data)) for r in range(2)]
    samplers = [eval_sampler(args(2, r), data) for r in range(2)]
    gathered = [i for b in range(samplers[0].num_batches) for r in range(2) if b < samplers[r].num_real_batches
                for i in ranks[r][2 * b:2 * b + 2]]
    assert gathered == single


def test_eval_shard_sampler_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rank=2"):
        EvalShardSampler(5, batch_size=2, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="batch_size=0"):
        EvalShardSampler(5, batch_size=0, num_replicas=2, rank=0)


def test_setup_process_logging_levels(tmp_path, env: pytest.MonkeyPatch) -> None:
    from trainwell import TrainingArguments
    from trainwell.utils.logging_utils import set_verbosity, setup_process_logging

    library = logging.getLogger("trainwell")
    before = library.level
    try:
        set_verbosity("info")
        passive = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
        assert setup_process_logging(passive) == logging.INFO  # passive keeps what the user set
        env.setenv("RANK", "1")
        env.setenv("LOCAL_RANK", "1")
        env.setenv("WORLD_SIZE", "2")
        replica = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[], log_level="warning",
                                    log_level_replica="error")
        assert setup_process_logging(replica) == logging.ERROR
        assert library.level == logging.ERROR
        with pytest.raises(ValueError, match="'loud'"):
            set_verbosity("loud")
    finally:
        library.setLevel(before)
