"""``ddp_find_unused_parameters`` left unset: a model with an unused branch trains under torchrun (2 ranks, gloo).

Upstream's default (the seeds' rule): ``find_unused_parameters=True`` unless gradient checkpointing is on. With it
set to False explicitly, DDP itself refuses the second step, as upstream does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.launch import run_json, torchrun

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("unused_params")
    return run_json(torchrun(HERE / "unused_params_job.py", out), out / "result.json",
                    "the 2-rank unused-parameters job", timeout=600)


def test_unused_branch_trains_with_the_default(result):
    default = result["default"]
    assert "error" not in default, default
    assert default["steps"] == 3 and default["find_unused"] is True
    assert default["loss"] == default["loss"]  # finite, not nan


def test_explicit_false_gives_ddps_error(result):
    assert "error" in result["explicit_false"]
    assert "unused" in result["explicit_false"]["error"] or "reduction" in result["explicit_false"]["error"]


def test_default_rule_in_the_arguments():
    # single process: the value DDP would get, read from the backend without a process group
    from trainwell import TrainingArguments
    from trainwell.backends.ddp import DDPBackend

    def find_unused(**kwargs: object) -> bool:
        args = TrainingArguments(output_dir="unused", use_cpu=True, **kwargs)
        backend = DDPBackend.__new__(DDPBackend)
        backend.args, backend.device = args, args.device
        return backend.ddp_kwargs()["find_unused_parameters"]

    assert find_unused() is True
    assert find_unused(gradient_checkpointing=True) is False
    assert find_unused(ddp_find_unused_parameters=False) is False
    assert find_unused(gradient_checkpointing=True, ddp_find_unused_parameters=True) is True
