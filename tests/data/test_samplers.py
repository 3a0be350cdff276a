"""Resumable samplers: per-(seed, epoch) determinism, distributed partition, seeking, state round-trip."""

from __future__ import annotations

import pytest
import torch

from trainwell.data.loader import build_dataloader, has_length
from trainwell.data.samplers import (
    LengthGroupedSampler,
    ResumableSampler,
    get_length_grouped_indices,
    infer_lengths,
    skip_first_batches,
)

torch.set_num_threads(1)


def test_order_is_pure_function_of_seed_and_epoch():
    a = ResumableSampler(20, seed=3)
    a.set_epoch(2)
    torch.manual_seed(123)  # the global RNG must not matter
    expected = torch.randperm(20, generator=torch.Generator().manual_seed(5)).tolist()
    assert list(a) == expected
    b = ResumableSampler(20, seed=3)
    list(b), list(b)  # iterating earlier epochs in this process changes nothing
    b.set_epoch(2)
    assert list(b) == expected
    a.set_epoch(3)
    assert list(a) != expected and sorted(a) == list(range(20))
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n,replicas", [(11, 3), (10, 4), (2, 3)])
def test_distributed_partition_pads_and_covers_all(n, replicas):
    parts = [list(ResumableSampler(n, seed=1, num_replicas=replicas, rank=r)) for r in range(replicas)]
    per_rank = -(-n // replicas)
    assert all(len(p) == per_rank for p in parts)
    assert len(ResumableSampler(n, num_replicas=replicas, rank=0)) == per_rank
    assert set().union(*map(set, parts)) == set(range(n))
    full = torch.randperm(n, generator=torch.Generator().manual_seed(1)).tolist()
    padded = (full * replicas)[:per_rank * replicas]
    assert parts[1] == padded[1::replicas]


def test_distributed_drop_last_cuts():
    parts = [list(ResumableSampler(11, num_replicas=3, rank=r, drop_last=True, shuffle=False)) for r in range(3)]
    assert parts == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    with pytest.raises(ValueError, match="rank"):
        ResumableSampler(4, num_replicas=2, rank=2)


def test_skip_yields_exact_tail_once():
    s = ResumableSampler(17, seed=9, num_replicas=2, rank=1)
    s.set_epoch(4)
    full = list(s)
    s.skip(5)
    assert len(s) == len(full) and s.remaining == len(full) - 5
    assert list(s) == full[5:]
    assert list(s) == full  # the skip is consumed by one iteration
    s.skip(100)
    assert s.remaining == 0 and list(s) == []
    with pytest.raises(ValueError):
        s.skip(-1)


def test_state_dict_round_trip_resumes_same_tail():
    s = ResumableSampler(12, seed=7)
    s.set_epoch(1)
    s.skip(4)
    state = s.state_dict()
    assert state == {"epoch": 1, "seed": 7, "skip": 4, "num_samples": 12}
    tail = list(s)
    fresh = ResumableSampler(12, seed=0)
    fresh.load_state_dict(state)
    assert fresh.epoch == 1 and fresh.seed == 7 and list(fresh) == tail and len(tail) == 8


def test_length_grouped_groups_lengths_and_is_resumable():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 100, (64,), generator=gen).tolist()
    s = LengthGroupedSampler(4, lengths=lengths, seed=2, mega_batch_mult=4)
    order = list(s)
    assert sorted(order) == list(range(64))
    assert lengths[order[0]] == max(lengths)  # the longest comes first
    for start in range(16, 64, 16):  # inside each later mega-batch, lengths do not increase
        block = [lengths[i] for i in order[start:start + 16]]
        assert block == sorted(block, reverse=True)
    spread = sum(max(lengths[i] for i in order[b:b + 4]) - min(lengths[i] for i in order[b:b + 4])
                 for b in range(0, 64, 4))
    shuffled = torch.randperm(64, generator=gen).tolist()
    random_spread = sum(max(lengths[i] for i in shuffled[b:b + 4]) - min(lengths[i] for i in shuffled[b:b + 4])
                        for b in range(0, 64, 4))
    assert spread < random_spread / 2
    s.skip(10)
    assert list(s) == order[10:]
    s.set_epoch(1)
    assert list(s) != order
    assert get_length_grouped_indices([], 4) == []


def test_length_grouped_distributed_and_infer_lengths():
    lengths = [3, 1, 4, 1, 5, 9, 2]
    parts = [list(LengthGroupedSampler(2, lengths=lengths, num_replicas=2, rank=r)) for r in range(2)]
    assert all(len(p) == 4 for p in parts) and set(parts[0]) | set(parts[1]) == set(range(7))
    assert infer_lengths([{"input_ids": [1, 2]}, {"input_ids": [1]}]) == [2, 1]

    class Columnar:
        column_names = ["input_ids", "length"]

        def __getitem__(self, key):
            return [5, 6] if key == "length" else None

    assert infer_lengths(Columnar()) == [5, 6]
    with pytest.raises(ValueError, match="'input_ids'"):
        infer_lengths([{"x": [1]}])


def test_skip_first_batches_reads_and_discards():
    seen = []

    def source():
        for i in range(6):
            seen.append(i)
            yield i

    assert list(skip_first_batches(source(), 4)) == [4, 5]
    assert seen == list(range(6))
    assert list(skip_first_batches([1, 2], 5)) == []


@pytest.mark.slow
def test_dataloader_with_resumable_sampler_and_iterable():
    data = list(range(10))
    sampler = ResumableSampler(10, seed=0)
    loader = build_dataloader(data, batch_size=3, collate_fn=None, sampler=sampler)
    full = [b.tolist() for b in loader]
    sampler.skip(6)
    assert [b.tolist() for b in loader] == full[2:]
    assert has_length(loader) and has_length(data)
    workers = build_dataloader(data, batch_size=2, collate_fn=None, num_workers=2, persistent_workers=True,
                               prefetch_factor=4, shuffle=True)
    assert workers.prefetch_factor == 4 and workers.persistent_workers and workers.num_workers == 2
    main = build_dataloader(data, batch_size=2, collate_fn=None, persistent_workers=True, prefetch_factor=4)
    assert main.num_workers == 0 and not main.persistent_workers

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(5))

    stream_loader = build_dataloader(Stream(), batch_size=2, collate_fn=None, shuffle=True, prefetch_factor=4)
    assert [b.tolist() for b in stream_loader] == [[0, 1], [2, 3], [4]]
    assert not has_length(Stream()) and not has_length(iter([1]))
    with pytest.raises(ValueError, match="IterableDataset"):
        build_dataloader(Stream(), batch_size=2, collate_fn=None, sampler=sampler)
    with pytest.raises(ValueError, match="mutually exclusive"):
        build_dataloader(data, batch_size=2, collate_fn=None, sampler=sampler, shuffle=True)
