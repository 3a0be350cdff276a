"""One TRL run, the same under transformers and trainwell: ``python trl_job.py CASE MODEL_DIR OUT [--patch]``.

CASE is ``sft`` (SFTTrainer on text), ``sft_peft`` (with a LoRA ``peft_config``) or ``dpo`` (DPOTrainer with a
ref_model). ``--patch`` calls ``trainwell.patch_transformers()`` first (the other route, ``trainwell run``, runs
this file unmodified). Writes OUT/log_history.json and the final model into OUT/final.
"""

import json
import sys
from pathlib import Path

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from world import preference_rows, text_rows  # noqa: E402


def main(case: str, model_dir: str, out: Path) -> None:
    from datasets import Dataset

    common = dict(output_dir=str(out / "run"), max_steps=6, per_device_train_batch_size=4, learning_rate=1e-3,
                  logging_steps=1, save_strategy="no", report_to="none", optim="adamw_torch", use_cpu=True,
                  seed=0, bf16=False, max_length=32, disable_tqdm=True)
    if case in ("sft", "sft_peft"):
        from trl import SFTConfig, SFTTrainer

        peft_config = None
        if case == "sft_peft":
            from peft import LoraConfig

            peft_config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
        trainer = SFTTrainer(model=model_dir, args=SFTConfig(**common), peft_config=peft_config,
                             train_dataset=Dataset.from_list(text_rows()))
    elif case == "dpo":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import DPOConfig, DPOTrainer

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        ref_model = AutoModelForCausalLM.from_pretrained(model_dir)
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=DPOConfig(**common, beta=0.1),
                             processing_class=AutoTokenizer.from_pretrained(model_dir),
                             train_dataset=Dataset.from_list(preference_rows()))
    else:
        raise SystemExit(f"unknown case {case!r}: use sft, sft_peft or dpo")
    trainer.train()
    trainer.save_model(str(out / "final"))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
