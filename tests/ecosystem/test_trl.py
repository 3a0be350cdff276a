"""TRL on trainwell: ``SFTTrainer`` (text data, and with a LoRA ``peft_config``) and ``DPOTrainer`` (with a
``ref_model``) log the same values at every step as on ``transformers.Trainer`` (same optimizer, ``adamw_torch``),
and the folder each saves loads with its library's loader; so do the generating trainers (GRPO, RLOO and the
experimental OnlineDPO, whose own ``_maybe_log_save_evaluate`` logs the learning rate the loop hands it).

The model is a two-layer Llama with a word-level tokenizer built offline (tests/ecosystem/world.py); each side runs
in a process of its own (tests/ecosystem/parity.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
pytest.importorskip("transformers")

from parity import largest_difference, run_both
from world import build_tiny_llama

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny_llama")))


def test_sft_on_text_matches_upstream_through_trainwell_run(model_dir, tmp_path):
    runs = run_both("trl_job.py", ["sft", model_dir], tmp_path, route="run")
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
    assert "trainwell Trainer under trl.SFTTrainer" in runs["output"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(runs["folder"]["trainwell"] / "final"))


def test_sft_with_peft_config_matches_upstream_through_the_patch(model_dir, tmp_path):
    runs = run_both("trl_job.py", ["sft_peft", model_dir], tmp_path, route="patch")
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
    from peft import AutoPeftModelForCausalLM

    model = AutoPeftModelForCausalLM.from_pretrained(str(runs["folder"]["trainwell"] / "final"))
    assert "lora_A" in " ".join(name for name, _ in model.named_parameters())


def test_dpo_with_a_ref_model_matches_upstream(model_dir, tmp_path):
    runs = run_both("trl_job.py", ["dpo", model_dir], tmp_path, route="run")
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
    assert "trainwell Trainer under trl.DPOTrainer" in runs["output"]
    assert any("rewards/margins" in entry for entry in runs["trainwell"])
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(str(runs["folder"]["trainwell"] / "final"))


@pytest.mark.parametrize("case", ["grpo", "rloo"])
def test_online_trainers_match_upstream(case, model_dir, tmp_path):
    """GRPOTrainer / RLOOTrainer (generation, a reward function, the reference model's KL, an evaluation every 3
    steps): every logged number equal to upstream's. They need what upstream's Trainer sets up for them: the
    ``parallelism_config`` field, accelerate's ``AcceleratorState`` (``set_seed(seed, device_specific=True)``) and
    ``Trainer._get_dataloader``."""
    runs = run_both("trl_job.py", [case, model_dir], tmp_path, route="patch")
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
    assert f"trainwell Trainer under trl.{case.upper()}Trainer" in runs["output"]
    assert sum("eval_loss" in entry for entry in runs["trainwell"]) == 2
    assert any("kl" in entry for entry in runs["trainwell"])


def test_online_dpo_logs_the_rate_each_step_used_as_upstream(model_dir, tmp_path):
    """TRL's experimental OnlineDPOTrainer overrides ``_maybe_log_save_evaluate`` and logs the ``learning_rate`` the
    loop hands it: every logged number (the rate at each step among them) equal to upstream's. Before trainwell
    handed the rate on, the override read the schedule after its step: 8.33e-4 at step 1 where upstream logs 1e-3."""
    runs = run_both("trl_job.py", ["online_dpo", model_dir], tmp_path, route="patch")
    rates = {side: [e["learning_rate"] for e in runs[side] if "learning_rate" in e] for side in ("upstream", "trainwell")}
    assert rates["trainwell"] == rates["upstream"] and rates["upstream"][0] == 1e-3 and len(rates["upstream"]) == 6
    assert largest_difference(runs["upstream"], runs["trainwell"]) <= 1e-5
    assert "trainwell Trainer under trl.OnlineDPOTrainer" in runs["output"]
    assert any("rewards/margins" in entry for entry in runs["trainwell"])
