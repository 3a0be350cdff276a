"""One TRL evaluation, the same under transformers and trainwell: ``python trl_eval_job.py CASE MODEL_DIR OUT``.

CASE is ``reward`` (``RewardTrainer``, the model loaded as a one-label sequence classifier) or ``dpo``
(``DPOTrainer`` with a ``ref_model``). Both collators put a batch's chosen and rejected sequences into one batch of
twice the pairs. After 4 training steps (so that the batches' losses differ), ``evaluate()`` runs over 8 pairs in 2
batches of 4. Writes OUT/log_history.json.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from world import preference_rows

EVAL_PAIRS, BATCH = 8, 4


def main(case: str, model_dir: str, out: Path) -> None:
    import json

    from datasets import Dataset

    rows = preference_rows()
    train, evaluation = Dataset.from_list(rows), Dataset.from_list(rows[:EVAL_PAIRS])
    common = dict(output_dir=str(out / "run"), per_device_eval_batch_size=BATCH, per_device_train_batch_size=BATCH,
                  max_steps=4, learning_rate=1e-2, optim="adamw_torch", logging_steps=1, report_to="none",
                  use_cpu=True, seed=0, bf16=False, max_length=32, disable_tqdm=True, save_strategy="no")
    if case == "reward":
        from trl import RewardConfig, RewardTrainer

        trainer = RewardTrainer(model=model_dir, args=RewardConfig(**common), train_dataset=train,
                                eval_dataset=evaluation)
    elif case == "dpo":
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import DPOConfig, DPOTrainer

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        ref_model = AutoModelForCausalLM.from_pretrained(model_dir)
        trainer = DPOTrainer(model=model, ref_model=ref_model, args=DPOConfig(**common, beta=0.1),
                             processing_class=AutoTokenizer.from_pretrained(model_dir), train_dataset=train,
                             eval_dataset=evaluation)
    else:
        raise SystemExit(f"unknown case {case!r}: use reward or dpo")
    trainer.train()
    trainer.evaluate()
    out.mkdir(parents=True, exist_ok=True)
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
