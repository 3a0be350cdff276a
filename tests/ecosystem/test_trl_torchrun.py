"""TRL's ``SFTTrainer`` on two CPU ranks (gloo): ``torchrun --nproc_per_node 2 -m trainwell run trl_job.py ...``
completes, both ranks train every step, and it logs the same values at every step as upstream's
``torchrun --nproc_per_node 2 trl_job.py ...`` (the same script, unpatched), and saves the same weights.

``average_tokens_across_devices`` is set explicitly on both sides (both default to True):
with True both sum the label tokens over the ranks and scale the loss by the world size; with False each rank
divides by its own count. 2 ranks x 2 rows a batch: the global batch of the one-rank parity test (4).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("trl")

from helpers import launch
from parity import JOBS, final_weights_difference, largest_difference
from world import build_tiny_llama

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
STEPS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny_llama")))


@pytest.mark.parametrize("avg_tokens", ["1", "0"], ids=["average_tokens", "per_rank_tokens"])
def test_sft_on_two_ranks_through_trainwell_run_matches_upstream_torchrun(model_dir, tmp_path, avg_tokens):
    script = JOBS / "trl_job.py"
    args = ["sft", model_dir]
    options = ["--batch", "2", "--avg-tokens", avg_tokens]
    folders = {"upstream": tmp_path / "upstream", "trainwell": tmp_path / "trainwell"}
    commands = {
        "upstream": launch.torchrun(script, *args, folders["upstream"], *options),
        "trainwell": launch.torchrun("trainwell", "run", script, *args, folders["trainwell"], *options, flags=["-m"]),
    }
    procs = {side: launch.start(cmd) for side, cmd in commands.items()}
    done = {side: launch.wait(proc, f"torchrun sft ({side})", timeout=240) for side, proc in procs.items()}
    assert "trainwell Trainer under trl.SFTTrainer" in done["trainwell"].stdout
    for side, folder in folders.items():
        for rank in (0, 1):  # both ranks ran every optimizer step
            assert json.loads((folder / f"rank{rank}.json").read_text()) == {"global_step": STEPS, "steps": STEPS}
    logs = {side: json.loads((folder / "log_history.json").read_text()) for side, folder in folders.items()}
    assert max(e["step"] for e in logs["trainwell"]) == STEPS
    assert largest_difference(logs["upstream"], logs["trainwell"]) <= 1e-6  # measured: 0.0 (both settings)
    assert final_weights_difference(folders["upstream"] / "final" / "model.safetensors",
                                    folders["trainwell"] / "final" / "model.safetensors") <= 1e-6  # measured: 0.0
