"""Which RNG file each rank restores, a resized job's ranks included (a job resumed on another number of processes).

The resized jobs themselves are ``tests/distributed/test_elastic_resume.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainwell.checkpoint.rng import rng_file_to_restore


def _touch(folder: Path, *names: str) -> Path:
    for name in names:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(b"x")
    return folder


@pytest.mark.parametrize(("saved", "rank", "world", "want", "resized"), [
    (["rng_state_0.pth", "rng_state_1.pth"], 0, 1, "rng_state_0.pth", True),  # 2 -> 1: rank 0's stream
    (["rng_state_0.pth", "rng_state_1.pth"], 1, 2, "rng_state_1.pth", False),  # same size: its own
    (["rng_state.pth"], 1, 2, "rng_state.pth", True),  # 1 -> 2: rank 1 continues rank 0's (1 mod 1)
    (["rng_state_0.pth", "rng_state_1.pth"], 3, 4, "rng_state_1.pth", True),  # 2 -> 4: rank 3 takes 3 mod 2
    (["rng_state_0.pth", "rng_state_1.pth", "rng_state_2.pth", "rng_state_3.pth"], 1, 2, "rng_state_1.pth", False),
    (["rng_state_0.pth"], 1, 2, None, False),  # same size, its own file missing: not another rank's
    ([], 0, 1, None, False),  # save_only_model: no RNG files
])
def test_each_rank_of_a_resized_job_restores_a_defined_stream(tmp_path, saved, rank, world, want, resized):
    path, other = rng_file_to_restore(_touch(tmp_path, *saved), rank, world)
    assert (path.name if path is not None else None) == want
    assert other is resized
