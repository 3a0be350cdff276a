"""One TRL run, the same under transformers and trainwell:
``python trl_job.py CASE MODEL_DIR OUT [--patch] [--stop-at N] [--resume CHECKPOINT] [--batch B] [--avg-tokens 0|1]``.

CASE is ``sft`` (SFTTrainer on text), ``sft_peft`` (with a LoRA ``peft_config``), ``dpo`` (DPOTrainer with a
ref_model), ``grpo`` or ``rloo`` (GRPOTrainer / RLOOTrainer with a reward function, evaluated every 3 steps),
``online_dpo`` (TRL's experimental OnlineDPOTrainer with a reward function). ``--patch`` calls ``trainwell.patch_transformers()`` first (the other route, ``trainwell run``, runs
this file unmodified). Writes OUT/log_history.json and the final model into OUT/final.

The resume and multi-rank cases (``sft``; ``grpo`` resumes too): ``--save-steps N`` saves a checkpoint every N steps (default: no
checkpoints); ``--stop-at N`` stops training (``control.should_training_stop``) right after the checkpoint of step
N is saved; ``--resume CHECKPOINT`` trains on from that checkpoint (``resume_from_checkpoint``) to the same
max_steps; ``--batch B`` is ``per_device_train_batch_size`` (default 4); ``--avg-tokens`` sets
``average_tokens_across_devices`` explicitly. Every rank writes OUT/rank{RANK}.json (its global_step and the number
of batches it trained on); rank 0 alone writes the log and the final model.
"""

import json
import sys
from pathlib import Path

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from world import SENTENCES, WORDS, preference_rows, text_rows
from job_options import option, stop_after_save


def step_counter():
    """A callback counting the optimizer steps this process ran (``on_step_end``)."""
    from transformers import TrainerCallback

    class Counter(TrainerCallback):
        steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            self.steps += 1

    return Counter()


def reward_words(completions, **kwargs):
    """A reward for the online cases: how many words of the vocabulary's first half each completion has."""
    first_half = set(WORDS[: len(WORDS) // 2])
    return [float(sum(word in first_half for word in completion.split())) for completion in completions]


def online_trainer(case: str, model_dir: str, common: dict, callbacks: list):
    """GRPOTrainer / RLOOTrainer on prompts of two words: 2 completions of at most 4 tokens each, a KL term to the
    reference model (beta), an evaluation every 3 steps on 4 prompts."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    config_cls, trainer_cls = (GRPOConfig, GRPOTrainer) if case == "grpo" else (RLOOConfig, RLOOTrainer)
    options = {k: v for k, v in common.items() if k != "max_length"}
    config = config_cls(**options, num_generations=2, max_completion_length=4, beta=0.1, eval_strategy="steps",
                        eval_steps=3, per_device_eval_batch_size=4)
    prompts = [{"prompt": " ".join(s.split()[:2])} for s in SENTENCES]
    return trainer_cls(model=model_dir, reward_funcs=reward_words, args=config,
                       train_dataset=Dataset.from_list(prompts[:12]), eval_dataset=Dataset.from_list(prompts[12:16]),
                       callbacks=callbacks)


def online_dpo_trainer(model_dir: str, common: dict, callbacks: list):
    """TRL's experimental OnlineDPOTrainer (it overrides ``_maybe_log_save_evaluate`` and logs the
    ``learning_rate`` it is handed): two completions of at most 4 tokens per prompt, ranked by a reward function."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    config = OnlineDPOConfig(**common, max_new_tokens=4, beta=0.1)
    prompts = [{"prompt": " ".join(s.split()[:2])} for s in SENTENCES]
    return OnlineDPOTrainer(model=model_dir, reward_funcs=reward_words, args=config,
                            processing_class=AutoTokenizer.from_pretrained(model_dir),
                            train_dataset=Dataset.from_list(prompts[:12]), callbacks=callbacks)


def main(case: str, model_dir: str, out: Path) -> None:
    import os

    from datasets import Dataset

    save_steps, stop_at, resume = option("--save-steps"), option("--stop-at"), option("--resume")
    common = dict(output_dir=str(out / "run"), max_steps=6, per_device_train_batch_size=int(option("--batch", 4)),
                  learning_rate=1e-3, logging_steps=1, report_to="none", optim="adamw_torch", use_cpu=True,
                  seed=0, bf16=False, max_length=32, disable_tqdm=True)
    common.update(dict(save_strategy="steps", save_steps=int(save_steps)) if save_steps else dict(save_strategy="no"))
    if option("--avg-tokens") is not None:
        common["average_tokens_across_devices"] = option("--avg-tokens") == "1"
    callbacks = [stop_after_save(int(stop_at))] if stop_at else []
    counter = step_counter()
    callbacks.append(counter)
    if case in ("sft", "sft_peft"):
        from trl import SFTConfig, SFTTrainer

        peft_config = None
        if case == "sft_peft":
            from peft import LoraConfig

            peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
        trainer = SFTTrainer(model=model_dir, args=SFTConfig(**common), peft_config=peft_config,
                             train_dataset=Dataset.from_list(text_rows()), callbacks=callbacks)
    elif case == "dpo":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import DPOConfig, DPOTrainer

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        ref_model = AutoModelForCausalLM.from_pretrained(model_dir)
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=DPOConfig(**common, beta=0.1),
                             processing_class=AutoTokenizer.from_pretrained(model_dir),
                             train_dataset=Dataset.from_list(preference_rows()), callbacks=callbacks)
    elif case in ("grpo", "rloo"):
        trainer = online_trainer(case, model_dir, common, callbacks)
    elif case == "online_dpo":
        trainer = online_dpo_trainer(model_dir, common, callbacks)
    else:
        raise SystemExit(f"unknown case {case!r}: use sft, sft_peft, dpo, grpo, rloo or online_dpo")
    trainer.train(resume_from_checkpoint=resume)
    rank = int(os.environ.get("RANK", 0))
    (out / f"rank{rank}.json").write_text(json.dumps({"global_step": trainer.state.global_step,
                                                      "steps": counter.steps}))
    trainer.save_model(str(out / "final"))
    if rank == 0:
        (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
