"""Library-built data loaders on several ranks, the same under transformers and trainwell:
``torchrun --nproc_per_node 2 ranks_job.py CASES WORLD_DIR OUT [--patch]``.

CASES is a comma-separated list run one after the other in the same processes (one launch for several cases):

* ``st``: ``SentenceTransformerTrainer`` (a tiny BERT with mean pooling, ``MultipleNegativesRankingLoss``) builds its
  own loaders around its own batch sampler and passes them to ``accelerator.prepare``: 16 pairs in batches of 4
  (2 steps an epoch on 2 ranks), 6 steps, an evaluation every 3 steps on 8 pairs in batches of 2;
* ``grpo``: ``GRPOTrainer`` (tests/ecosystem/jobs/trl_job.py's set-up) samples with its own ``RepeatSampler``
  (``_get_train_sampler`` / ``_get_eval_sampler``): 12 prompts, 6 steps, an evaluation every 3 steps on 5 prompts;
* ``dpo_eval7`` / ``dpo_eval6``: ``DPOTrainer`` (trainwell's samplers) trains 2 steps, then evaluates 7 / 6 pairs
  (``evaluate()``), in global batches of 4 (2 a process on 2 ranks, 4 on one): an uneven evaluation set whose TRL
  metrics (``eval_rewards/*``, ``eval_logps/*``...) are gathered inside ``compute_loss``. With 7 pairs rank 1's
  second batch is short (one pair); with 6 it has no pair left (a placeholder batch of pair 5 again).

WORLD_DIR holds ``bert`` and ``llama`` (tests/ecosystem/world.py). Rank 0 writes OUT/CASE.json (the log history);
every rank writes OUT/CASE.rank{RANK}.json (its global_step, epoch and the optimizer steps it ran).
"""

import json
import os
import sys
from pathlib import Path

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from world import SENTENCES, preference_rows
from trl_job import online_trainer, step_counter

COMMON = dict(learning_rate=1e-3, logging_steps=1, report_to="none", optim="adamw_torch", use_cpu=True, seed=0,
              disable_tqdm=True, save_strategy="no")


def st(world: Path, out: Path, callbacks: list):
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments, models
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import set_seed

    set_seed(0)
    word = models.Transformer(str(world / "bert"))
    model = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension())], device="cpu")
    n = len(SENTENCES)
    pairs = [{"anchor": s, "positive": SENTENCES[(i + 1) % n]} for i, s in enumerate(SENTENCES)]
    args = SentenceTransformerTrainingArguments(
        output_dir=str(out / "st_run"), max_steps=6, per_device_train_batch_size=4, per_device_eval_batch_size=2,
        eval_strategy="steps", eval_steps=3, **COMMON)
    return SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_list(pairs[:16]),
                                      eval_dataset=Dataset.from_list(pairs[10:18]),
                                      loss=MultipleNegativesRankingLoss(model), callbacks=callbacks)


def grpo(world: Path, out: Path, callbacks: list):
    from datasets import Dataset

    common = dict(COMMON, output_dir=str(out / "grpo_run"), max_steps=6, per_device_train_batch_size=4, bf16=False)
    trainer = online_trainer("grpo", str(world / "llama"), common, callbacks)
    trainer.eval_dataset = Dataset.from_list([{"prompt": " ".join(s.split()[:2])} for s in SENTENCES[12:17]])
    return trainer


def dpo_eval(world: Path, out: Path, callbacks: list, pairs: int):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    model = AutoModelForCausalLM.from_pretrained(str(world / "llama"))
    ref_model = AutoModelForCausalLM.from_pretrained(str(world / "llama"))
    batch = 4 // int(os.environ.get("WORLD_SIZE", 1))  # global batches of 4 pairs on 1 or 2 processes
    args = DPOConfig(output_dir=str(out / "dpo_run"), per_device_train_batch_size=batch,
                     per_device_eval_batch_size=batch, max_steps=2, beta=0.1, bf16=False, max_length=32,
                     **dict(COMMON, learning_rate=1e-2))
    return DPOTrainer(model=model, ref_model=ref_model, args=args, callbacks=callbacks,
                      processing_class=AutoTokenizer.from_pretrained(str(world / "llama")),
                      train_dataset=Dataset.from_list(preference_rows()),
                      eval_dataset=Dataset.from_list(preference_rows()[:pairs]))


CASES = {"st": st, "grpo": grpo, "dpo_eval7": lambda *a: dpo_eval(*a, pairs=7),
         "dpo_eval6": lambda *a: dpo_eval(*a, pairs=6)}


def main(cases: str, world: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", 0))
    for case in cases.split(","):
        counter = step_counter()
        trainer = CASES[case](world, out, [counter])
        trainer.train()
        if case.startswith("dpo_eval"):
            trainer.evaluate()
        (out / f"{case}.rank{rank}.json").write_text(json.dumps(
            {"global_step": trainer.state.global_step, "epoch": trainer.state.epoch, "steps": counter.steps}))
        if rank == 0:
            (out / f"{case}.json").write_text(json.dumps(trainer.state.log_history))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]))
