"""Every class of the library matrix on two ranks, the same under transformers and trainwell:
``torchrun --nproc_per_node 2 matrix_ranks_job.py CASES WORLD OUT [--patch]``.

CASES is a comma-separated list of matrix_job.py's cases, run one after the other in the same two processes (one
launch a side: the imports are paid once). Each case is built as matrix_job.py builds it (batches of 4 a process,
6 steps, a checkpoint every 3), with an evaluation set of 11 rows (3 of the training rows, then the case's 8), which
2 ranks do not split evenly (rank 0 evaluates batches of 4 and 3 rows, rank 1 one of 4), and runs the phases a user
would on several ranks:

- ``train``: 6 steps; rank 0 writes the model's weights to OUT/CASE/weights.safetensors;
- ``evaluate``: ``trainer.evaluate()``;
- ``predict``: ``trainer.predict(eval set)``: its metrics and a summary of its predictions (as gathered on rank 0);
- ``resume``: a fresh trainer resumed from the checkpoint of step 3 to step 6 (OUT/CASE/resumed.safetensors).

(``load`` is matrix_job.py's one-process phase: the saved folder does not depend on the number of ranks.)

Rank 0 writes OUT/CASE/result.json (matrix_job.py's format); every rank writes OUT/CASE/rank{RANK}.json: the
``args.world_size`` its trainer saw, its ``global_step`` and ``epoch``, and the errors it met.

``python matrix_ranks_job.py CASES WORLD OUT --truth RANKS_OUT --patch`` (one process) is the ground truth of the
evaluation: each case's trainer with the weights the two ranks trained (RANKS_OUT/CASE/weights.safetensors)
evaluates and predicts the same 11 rows in the same batches of 4 on one process (OUT/CASE/truth.json).
"""

import json
import os
import sys
import time
import traceback
from pathlib import Path

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parent))
from matrix_job import PROBE, SAVE, build, build_setfit, predicted, summarize, write_weights

TRL_SUFFIX = ("SFTTrainer", "DPOTrainer", "KTOTrainer", "RewardTrainer", "GRPOTrainer", "RLOOTrainer",
              "DistillationTrainer")
EXTRA_ROWS = 3  # 8 + 3 = 11 rows: batches of 4, 4 and 3, one round and a half on 2 ranks


def uneven_eval_set(dataset, train_dataset):
    """``dataset`` (already prepared by the library) after the first EXTRA_ROWS rows of ``train_dataset``."""
    from datasets import concatenate_datasets

    return concatenate_datasets([train_dataset.select(range(EXTRA_ROWS)), dataset])


def trainer_phases(case: str, world: Path, out: Path, result: dict, state: dict) -> tuple:
    """train / evaluate / predict / resume of a ``transformers.Trainer`` subclass."""

    def new_trainer(folder: str):
        trainer = build(case, world, out / folder, [])
        trainer.eval_dataset = uneven_eval_set(trainer.eval_dataset, trainer.train_dataset)
        return trainer

    def train():
        state["trainer"] = trainer = new_trainer("run")
        trainer.train()
        if trainer.args.process_index == 0:
            write_weights(trainer.model, out / "weights.safetensors")
        result["history"] = trainer.state.log_history

    def evaluate():
        result["evaluate"] = state["trainer"].evaluate()
        result["history"] = state["trainer"].state.log_history

    def predict():
        result["predict"] = predicted(state["trainer"])

    def resume():
        trainer = new_trainer("resumed_run")
        trainer.train(resume_from_checkpoint=str(out / "run" / f"checkpoint-{SAVE}"))
        if trainer.args.process_index == 0:
            write_weights(trainer.model, out / "resumed.safetensors")
        result["resumed_history"] = trainer.state.log_history

    return ("train", train), ("evaluate", evaluate), ("predict", predict), ("resume", resume)


def setfit_phases(world: Path, out: Path, result: dict, state: dict) -> tuple:
    """setfit's ``Trainer``: train (its body on ``BCSentenceTransformersTrainer``), evaluate, predict_proba; its
    ``train`` takes no checkpoint to resume from."""

    def train():
        state["trainer"] = trainer = build_setfit(world, out / "run")
        trainer.eval_dataset = uneven_eval_set(trainer.eval_dataset, trainer.train_dataset)
        trainer.train()
        if int(os.environ.get("RANK", 0)) == 0:
            write_weights(trainer.model.model_body, out / "weights.safetensors")
        result["history"] = trainer.st_trainer.state.log_history

    def evaluate():
        result["evaluate"] = state["trainer"].evaluate()

    def predict():
        texts = list(state["trainer"].eval_dataset["text"]) + PROBE
        result["predict"] = {"predictions": summarize(state["trainer"].model.predict_proba(texts).numpy())}

    result["unsupported"] = {"resume": "setfit.Trainer.train() takes no resume_from_checkpoint"}
    return ("train", train), ("evaluate", evaluate), ("predict", predict)


def world_seen(state: dict) -> dict:
    """What this rank's trainer saw: ``args.world_size``, ``global_step``, ``epoch``."""
    trainer = state.get("trainer")
    inner = getattr(trainer, "st_trainer", trainer)  # setfit keeps the transformers trainer of its body phase
    if inner is None:
        return {}
    return {"world_size": inner.args.world_size, "global_step": inner.state.global_step, "epoch": inner.state.epoch}


def run_case(case: str, world: Path, out: Path) -> None:
    """Every phase of ``case``; a phase that raises is written down (on every rank) and the next runs."""
    out.mkdir(parents=True, exist_ok=True)
    rank = int(os.environ.get("RANK", 0))
    result: dict = {"errors": {}, "seconds": {}}
    state: dict = {}
    phases = setfit_phases(world, out, result, state) if case == "setfit" else \
        trainer_phases(case, world, out, result, state)
    for name, body in phases:
        if "train" in result["errors"]:
            result["errors"][name] = "not run: train failed"
            continue
        start = time.perf_counter()
        try:
            body()
        except Exception as exc:  # recorded: the test decides which phases must pass
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        result["seconds"][name] = round(time.perf_counter() - start, 2)
    (out / f"rank{rank}.json").write_text(json.dumps({**world_seen(state), "errors": result["errors"]}))
    if rank == 0:
        (out / "result.json").write_text(json.dumps(result, default=float))


def truth(case: str, world: Path, out: Path, trained: Path) -> None:
    """The evaluation and prediction of ``case`` on one process, with the weights the two ranks trained: in the
    batches each rank evaluated (4 rows; sentence-transformers' trainers with the ``dataloader_drop_last`` they set
    on several processes), and ``evaluate()`` again in the global batches of the two ranks (8 rows: what TRL's
    metrics, gathered over the ranks inside ``compute_loss``, are averaged over)."""
    from safetensors.torch import load_file

    out.mkdir(parents=True, exist_ok=True)
    trainer = build(case, world, out / "run", [])
    trainer.eval_dataset = uneven_eval_set(trainer.eval_dataset, trainer.train_dataset)
    trainer.model.load_state_dict(load_file(str(trained / "weights.safetensors")))
    if not case.endswith(TRL_SUFFIX):
        trainer.args.dataloader_drop_last = True
    result = {"predict": predicted(trainer)}
    result["evaluate"] = trainer.evaluate()
    trainer.args.per_device_eval_batch_size = 8
    result["evaluate_global_batches"] = trainer.evaluate()
    (out / "truth.json").write_text(json.dumps(result, default=float))


if __name__ == "__main__":
    names, world_dir, out_dir = sys.argv[1].split(","), Path(sys.argv[2]), Path(sys.argv[3])
    if "--truth" in sys.argv:
        ranks_out = Path(sys.argv[sys.argv.index("--truth") + 1])
        for name in names:
            truth(name, world_dir, out_dir / name, ranks_out / name)
    else:
        for name in names:
            run_case(name, world_dir, out_dir / name)
