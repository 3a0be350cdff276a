"""The README's Ray Train script ("Under Ray Train") on 2 CPU workers of one local Ray session: trainwell's numbers
equal upstream's (the same script with transformers' Trainer and Ray's own helpers), metrics and checkpoints reach
Ray, and a worker SIGKILLed after a checkpoint is restarted by Ray and resumes exactly."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

pytest.importorskip("ray.train")
pytest.importorskip("transformers")

from helpers.ray_session import ray_session
from trainwell import TrainerCallback

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]  # Ray's start-up alone took up to 400 s at load 8
README = Path(__file__).resolve().parents[2] / "README.md"
TRAINWELL_HELPERS = "from trainwell.integrations.ray_train import"
RAY_HELPERS = "from ray.train.huggingface.transformers import"


def readme_script() -> str:
    """The python block of README.md that starts with ``# ray_train.py``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return next(block for block in blocks if block.startswith("# ray_train.py"))


def load_script(name: str, *, upstream_trainer: bool = False, ray_helpers: bool = False) -> types.ModuleType:
    """The README script as a module (not ``__main__``): trainwell's as written, or with transformers' Trainer and
    ``TrainingArguments`` and/or Ray's own Hugging Face helpers in place of trainwell's (the only lines changed)."""
    code = readme_script()
    assert "from trainwell import Trainer, TrainingArguments\n" in code and TRAINWELL_HELPERS in code
    if upstream_trainer:
        code = code.replace("from trainwell import Trainer", "from transformers import Trainer")
    if ray_helpers:
        code = code.replace(TRAINWELL_HELPERS, RAY_HELPERS)
    module = types.ModuleType(name)
    sys.modules[name] = module  # registered only to be pickled by value: Ray's workers cannot import it
    try:
        exec(compile(code, f"README.md ({name})", "exec"), module.__dict__)
    finally:
        del sys.modules[name]
    return module


class KillOnce(TrainerCallback):
    """SIGKILLs rank 1 at the end of step 5 (after the checkpoint of step 4), on the first attempt only (a marker
    file); records the step each attempt starts training at."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.started = False

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.started and args.process_index == 0:
            self.started = True
            with open(os.path.join(self.folder, "starts"), "a") as f:
                f.write(f"{state.global_step}\n")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        marker = os.path.join(self.folder, "killed")
        if state.global_step == 5 and args.process_index == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture(autouse=True)
def _driver_signal_handlers_put_back() -> Iterator[None]:
    """Ray Train's ``fit()`` installs its own SIGINT handler in the driver (this process): put back the one found."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def session() -> Iterator[Path]:
    """One Ray session for the module; yields its scratch folder (short paths, removed at the end)."""
    with ray_session(num_cpus=2) as (ray, folder):
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield folder


@pytest.fixture(scope="module")
def trainwell_run(session: Path) -> tuple[Any, Path]:
    """The README script as written: Ray's result and the output_dir."""
    out = session / "tw-out"
    return load_script("ray_readme_trainwell").main(str(out), str(session / "tw-ray")), out


def final_state(result: Any) -> tuple[list[float], dict[str, torch.Tensor], dict[str, Any]]:
    """From Ray's final checkpoint: the per-step training losses, the weights and the marker's file list."""
    from safetensors.torch import load_file

    with result.checkpoint.as_directory() as folder:
        checkpoint = Path(folder) / "checkpoint"
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        weights = load_file(checkpoint / "model.safetensors")
        marker = json.loads((checkpoint / ".complete").read_text()) if (checkpoint / ".complete").exists() else {}
    assert state["global_step"] == 8
    return [entry["loss"] for entry in state["log_history"] if "loss" in entry], weights, marker


def test_trainwell_under_ray_train_equals_upstream_under_ray_train(session: Path,
                                                                   trainwell_run: tuple[Any, Path]) -> None:
    result, out = trainwell_run
    upstream = load_script("ray_readme_upstream", upstream_trainer=True, ray_helpers=True).main(
        str(session / "up-out"), str(session / "up-ray"))
    losses, weights, marker = final_state(result)
    up_losses, up_weights, _ = final_state(upstream)
    assert len(losses) == 8 and losses == pytest.approx(up_losses, abs=1e-6)
    assert weights.keys() == up_weights.keys()
    for name in weights:
        torch.testing.assert_close(weights[name], up_weights[name], rtol=0, atol=1e-6)
    # metrics reached Ray: the last report is the step-8 save's, with the logged loss of step 8
    assert result.metrics["step"] == 8 and result.metrics["loss"] == pytest.approx(losses[-1])
    # the trainwell checkpoint survived Ray's copy: its marker lists the files, and trainwell verifies the copy
    from trainwell.checkpoint.layout import verify_checkpoint

    assert "model.safetensors" in json.dumps(marker)
    with result.checkpoint.as_directory() as folder:
        verify_checkpoint(Path(folder) / "checkpoint")
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-2", "checkpoint-4", "checkpoint-6", "checkpoint-8"]


def test_a_worker_killed_after_a_checkpoint_is_restarted_by_ray_and_resumes_exactly(
        session: Path, trainwell_run: tuple[Any, Path]) -> None:
    # Ray's own helpers this time (they work on a trainwell Trainer too); the numbers must not change
    script = load_script("ray_readme_kill", ray_helpers=True)
    folder = session / "kill"
    folder.mkdir()
    result = script.main(str(folder / "out"), str(folder / "ray"), callbacks=[KillOnce(str(folder))])
    assert (folder / "killed").exists()
    # the restarted workers went on from a checkpoint Ray had registered: step 4's, or step 2's when the controller
    # had not yet collected step 4's report from the workers when one died (Ray polls the reports)
    starts = (folder / "starts").read_text().split()
    assert starts[0] == "0" and starts[1:] in (["4"], ["2"]), starts
    losses, weights, _ = final_state(result)
    expected_losses, expected_weights, _ = final_state(trainwell_run[0])
    assert losses == expected_losses
    for name in weights:
        assert torch.equal(weights[name], expected_weights[name]), name
