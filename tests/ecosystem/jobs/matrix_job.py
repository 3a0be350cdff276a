"""One trainer class of the library matrix, the same under transformers and trainwell:
``python matrix_job.py CASE WORLD OUT [--patch]``.

CASE names a trainer class (``SFTTrainer`` ... ``MultiVectorEncoderTrainer``) or ``setfit`` (setfit's
``Trainer``), or several, comma-separated, run one after the other in this process (each into OUT/CASE; the
warnings and log lines into OUT/job.log); WORLD holds the tiny models (``WORLD/llama``, ``WORLD/bert``, built by
tests/ecosystem/world.py); ``--patch`` calls ``trainwell.patch_transformers()`` first. One process does every phase
a user would, in order, each recorded on its own (a phase that raises is written down and the next runs):

- ``train``: 6 steps, a checkpoint every 3, then the model's weights written to OUT/weights.safetensors;
- ``evaluate``: ``trainer.evaluate()`` on the eval set (with ``compute_metrics`` where the trainer takes one);
- ``predict``: ``trainer.predict(eval set)``: its metrics and a summary of its predictions;
- ``load``: ``trainer.save_model(OUT/final)``, loaded back by the library's own loader, and its outputs on fixed input;
- ``resume``: a fresh trainer resumed from the checkpoint of step 3 to step 6 (weights into
  OUT/resumed.safetensors).

Writes OUT/result.json: ``history`` (log_history after evaluate), ``evaluate``, ``predict``, ``loaded``,
``resumed_history``, ``errors`` ({phase: "Type: message"}), ``seconds`` ({phase: wall time}) and ``cpu_s`` (the
process's CPU time, imports included).
"""

import json
import resource
import sys
import time
import traceback
from pathlib import Path

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from world import SENTENCES, preference_rows, text_rows

STEPS, SAVE = 6, 3
PROBE = ["the cat sat on the mat", "a big dog ran far"]


def common(out: Path) -> dict:
    """The arguments every case shares: 6 steps of batches of 4, a checkpoint every 3, plain AdamW, CPU, seed 0."""
    return dict(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                learning_rate=1e-3, logging_steps=1, save_strategy="steps", save_steps=SAVE, report_to="none",
                optim="adamw_torch", use_cpu=True, seed=0, disable_tqdm=True)


def summarize(predictions) -> list:
    """Row count, sum and sum of squares of every array in ``predictions`` (a tuple/list of arrays or one array;
    -100 padding included, as upstream pads)."""
    import numpy as np

    arrays = predictions if isinstance(predictions, (tuple, list)) else [predictions]
    out = []
    for a in arrays:
        if a is None:
            continue
        a = np.asarray(a, dtype=np.float64)
        out.append([int(a.shape[0]) if a.ndim else 1, float(a.sum()), float((a * a).sum())])
    return out


def predicted(trainer) -> dict:
    """``trainer.predict(trainer.eval_dataset)``: its metrics, and a summary of its predictions and labels."""
    prediction = trainer.predict(trainer.eval_dataset)
    return {"metrics": prediction.metrics, "predictions": summarize(prediction.predictions),
            "labels": summarize(prediction.label_ids)}


def metrics_of(prediction) -> dict:
    """A ``compute_metrics``: the summary of the predictions and of the labels, as numbers."""
    numbers = {}
    for name, value in (("pred", prediction.predictions), ("label", prediction.label_ids)):
        for i, (rows, total, squares) in enumerate(summarize(value)):
            numbers.update({f"{name}{i}_rows": rows, f"{name}{i}_sum": total, f"{name}{i}_sq": squares})
    return numbers


def llama_rows(kind: str) -> tuple:
    """(train, eval) data sets of one kind: text, preference, unpaired (KTO) or prompt."""
    from datasets import Dataset

    if kind == "text":
        rows = text_rows()
    elif kind == "preference":
        rows = preference_rows()
    elif kind == "unpaired":
        rows = [{"prompt": r["prompt"], "completion": r[c], "label": c == "chosen"}
                for r in preference_rows() for c in ("chosen", "rejected")]
    else:
        rows = [{"prompt": " ".join(s.split()[:3])} for s in SENTENCES]
    return Dataset.from_list(rows[:16]), Dataset.from_list(rows[-8:])


def length_reward(completions, **kwargs):
    """A reward that needs no model: the completion's length in characters, scaled."""
    return [len(c) / 10.0 for c in completions]


def build_trl(case: str, world: Path, out: Path, callbacks: list):
    """The TRL trainer of ``case`` on the tiny Llama, as TRL's documentation builds it."""
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama = str(world / "llama")
    base = common(out)
    if case == "SFTTrainer":
        train, evals = llama_rows("text")
        return trl.SFTTrainer(model=llama, args=trl.SFTConfig(**base, max_length=32), train_dataset=train,
                              eval_dataset=evals, compute_metrics=metrics_of, callbacks=callbacks)
    if case in ("DPOTrainer", "KTOTrainer"):
        kind = "preference" if case == "DPOTrainer" else "unpaired"
        train, evals = llama_rows(kind)
        config = getattr(trl, case.replace("Trainer", "Config"))(**base, beta=0.1, max_length=32)
        return getattr(trl, case)(model=AutoModelForCausalLM.from_pretrained(llama),
                                  ref_model=AutoModelForCausalLM.from_pretrained(llama), args=config,
                                  processing_class=AutoTokenizer.from_pretrained(llama), train_dataset=train,
                                  eval_dataset=evals, compute_metrics=metrics_of, callbacks=callbacks)
    if case == "RewardTrainer":
        import torch

        train, evals = llama_rows("preference")
        torch.manual_seed(0)  # the score head is new: the same on both sides
        return trl.RewardTrainer(model=llama, args=trl.RewardConfig(**base, max_length=32), train_dataset=train,
                                 eval_dataset=evals, compute_metrics=metrics_of, callbacks=callbacks)
    train, evals = llama_rows("prompt")
    sampling = dict(max_completion_length=4, per_device_eval_batch_size=4)
    if case in ("GRPOTrainer", "RLOOTrainer"):
        config = getattr(trl, case.replace("Trainer", "Config"))(**{**base, **sampling}, num_generations=2)
        return getattr(trl, case)(model=llama, reward_funcs=length_reward, args=config, train_dataset=train,
                                  eval_dataset=evals, callbacks=callbacks)
    if case == "DistillationTrainer":
        return trl.DistillationTrainer(model=llama, teacher_model=llama,
                                       args=trl.DistillationConfig(**{**base, **sampling}), train_dataset=train,
                                       eval_dataset=evals, callbacks=callbacks)
    raise SystemExit(f"unknown case {case!r}")


def st_pairs(kind: str) -> tuple:
    """(train, eval) sentence pairs: anchor/positive, or sentence1/sentence2/label for the cross encoder."""
    from datasets import Dataset

    n = len(SENTENCES)
    if kind == "cross":
        rows = [{"sentence1": s, "sentence2": SENTENCES[(i + 1 + i % 2) % n], "label": float(i % 2)}
                for i, s in enumerate(SENTENCES)]
    else:
        rows = [{"anchor": s, "positive": SENTENCES[(i + 1) % n]} for i, s in enumerate(SENTENCES)]
    return Dataset.from_list(rows[:16]), Dataset.from_list(rows[-8:])


def build_st(case: str, world: Path, out: Path, callbacks: list):
    """The sentence-transformers trainer of ``case`` on the tiny BERT (the model class loads the plain folder)."""
    import sentence_transformers as st
    import sentence_transformers.cross_encoder.losses
    import sentence_transformers.losses
    import torch

    bert = str(world / "bert")
    torch.manual_seed(0)  # heads new to the folder (the cross encoder's score, the multi-vector Dense)
    if case == "SentenceTransformerTrainer":
        model = st.SentenceTransformer(bert, device="cpu")
        loss, args_cls = st.losses.MultipleNegativesRankingLoss(model), st.SentenceTransformerTrainingArguments
    elif case == "CrossEncoderTrainer":
        model = st.CrossEncoder(bert, num_labels=1, device="cpu")
        loss, args_cls = st.cross_encoder.losses.BinaryCrossEntropyLoss(model), st.CrossEncoderTrainingArguments
    elif case == "SparseEncoderTrainer":
        from sentence_transformers.sparse_encoder import losses

        model = st.SparseEncoder(bert, device="cpu")
        loss = losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model),
                                 query_regularizer_weight=5e-5, document_regularizer_weight=3e-5)
        args_cls = st.SparseEncoderTrainingArguments
    elif case == "MultiVectorEncoderTrainer":
        from sentence_transformers.multi_vector_encoder import losses
        from sentence_transformers.multi_vector_encoder.model import MultiVectorEncoder
        from sentence_transformers.multi_vector_encoder.training_args import MultiVectorEncoderTrainingArguments

        model = MultiVectorEncoder(bert, device="cpu")
        loss, args_cls = losses.MultiVectorMultipleNegativesRankingLoss(model), MultiVectorEncoderTrainingArguments
    else:
        raise SystemExit(f"unknown case {case!r}")
    train, evals = st_pairs("cross" if case == "CrossEncoderTrainer" else "pairs")
    trainer_cls = getattr(st, case)
    return trainer_cls(model=model, args=args_cls(**common(out)), train_dataset=train, eval_dataset=evals,
                       loss=loss, callbacks=callbacks)


def build(case: str, world: Path, out: Path, callbacks: list):
    """The trainer of ``case``, writing its checkpoints under ``out``."""
    import torch

    torch.manual_seed(0)
    if case in ("SFTTrainer", "DPOTrainer", "KTOTrainer", "RewardTrainer", "GRPOTrainer", "RLOOTrainer",
                "DistillationTrainer"):
        return build_trl(case, world, out, callbacks)
    return build_st(case, world, out, callbacks)


def transformers_outputs(folder: Path, sequence_classification: bool = False) -> list:
    """A saved transformers model (``AutoModelForCausalLM``, or ``AutoModelForSequenceClassification``) and its
    tokenizer loaded from ``folder``: a summary of its logits on PROBE."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    loader = AutoModelForSequenceClassification if sequence_classification else AutoModelForCausalLM
    model, tok = loader.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        values = model(**tok(PROBE, return_tensors="pt", padding=True)).logits
    return summarize(values.numpy())


def probe(case: str, folder: Path) -> list:
    """The saved folder loaded by its library's own loader, and its outputs on PROBE (a few numbers)."""
    import numpy as np

    if case in ("SFTTrainer", "DPOTrainer", "KTOTrainer", "GRPOTrainer", "RLOOTrainer", "DistillationTrainer",
                "RewardTrainer"):
        return transformers_outputs(folder, sequence_classification=case == "RewardTrainer")
    import sentence_transformers as st

    if case == "CrossEncoderTrainer":
        return summarize(st.CrossEncoder(str(folder), device="cpu").predict([PROBE]))
    if case == "MultiVectorEncoderTrainer":
        from sentence_transformers.multi_vector_encoder.model import MultiVectorEncoder

        return summarize([np.asarray(e) for e in MultiVectorEncoder(str(folder), device="cpu").encode(PROBE)])
    cls = {"SentenceTransformerTrainer": st.SentenceTransformer, "SparseEncoderTrainer": st.SparseEncoder}[case]
    values = cls(str(folder), device="cpu").encode(PROBE, convert_to_tensor=True)
    return summarize(values.to_dense().numpy() if values.is_sparse else values.numpy())


def build_setfit(world: Path, out: Path):
    """setfit's ``Trainer`` (its body phase runs on sentence-transformers' trainer) on the tiny BERT, with a
    metric that needs no download."""
    import numpy as np
    import torch
    from datasets import Dataset
    from setfit import SetFitModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = SetFitModel.from_pretrained(str(world / "bert"), device="cpu")
    rows = [{"text": s, "label": int(any(w in s for w in ("cat", "dog", "fox", "bird")))} for s in SENTENCES]
    args = TrainingArguments(output_dir=str(out), batch_size=4, num_epochs=1, max_steps=STEPS, logging_steps=1,
                             save_strategy="steps", save_steps=SAVE, report_to="none", seed=0,
                             body_learning_rate=1e-3, num_iterations=2)

    def accuracy(y_pred, y_test) -> dict:
        return {"accuracy": float(np.mean(np.asarray(y_pred) == np.asarray(y_test)))}

    return Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows[:16]),
                   eval_dataset=Dataset.from_list(rows[-8:]), metric=accuracy)


def setfit_phases(world: Path, out: Path, result: dict, state: dict) -> tuple:
    """The phases of the setfit route: ``Trainer.train``, ``Trainer.evaluate``, ``SetFitModel.predict_proba``,
    ``save_pretrained`` / ``SetFitModel.from_pretrained``; setfit's ``train`` takes no checkpoint to resume from."""
    from setfit import SetFitModel

    def train():
        state["trainer"] = trainer = build_setfit(world, out / "run")
        trainer.train()
        write_weights(trainer.model.model_body, out / "weights.safetensors")
        result["history"] = trainer.st_trainer.state.log_history  # the body phase's trainer

    def evaluate():
        result["evaluate"] = state["trainer"].evaluate()

    def predict():
        texts = state["trainer"].eval_dataset["text"]
        result["predict"] = {"predictions": summarize(state["trainer"].model.predict_proba(texts).numpy())}

    def load():
        state["trainer"].model.save_pretrained(str(out / "final"))
        loaded = SetFitModel.from_pretrained(str(out / "final"), device="cpu")
        result["loaded"] = summarize(loaded.predict_proba(PROBE).numpy())

    result["unsupported"] = {"resume": "setfit.Trainer.train() takes no resume_from_checkpoint"}
    return ("train", train), ("evaluate", evaluate), ("predict", predict), ("load", load)


def write_weights(model, path: Path) -> None:
    """Every tensor of ``model.state_dict()``, copied (tied weights too), into one safetensors file."""
    from safetensors.torch import save_file

    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, str(path))


def run_case(case: str, world: Path, out: Path, *, build=build, probe=probe, cpu_since: float = 0.0) -> dict:
    """Every phase of ``case`` (its trainer from ``build(case, world, folder, callbacks)``, its saved folder read
    back by ``probe(case, folder)``), written to OUT/result.json and returned; ``cpu_s`` is the process's CPU time
    less ``cpu_since`` (jobs/experimental_job.py runs several cases in one process)."""
    result: dict = {"errors": {}, "seconds": {}}
    state: dict = {}

    def phase(name, body):
        start = time.perf_counter()
        try:
            body()
        except Exception as exc:  # recorded: the test decides which phases must pass
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        result["seconds"][name] = round(time.perf_counter() - start, 2)

    def train():
        state["trainer"] = trainer = build(case, world, out / "run", [])
        trainer.train()
        write_weights(trainer.model, out / "weights.safetensors")
        result["history"] = trainer.state.log_history

    def evaluate():
        result["evaluate"] = state["trainer"].evaluate()
        result["history"] = state["trainer"].state.log_history

    def predict():
        result["predict"] = predicted(state["trainer"])

    def load():
        state["trainer"].save_model(str(out / "final"))
        result["loaded"] = probe(case, out / "final")

    def resume():
        trainer = build(case, world, out / "resumed_run", [])
        trainer.train(resume_from_checkpoint=str(out / "run" / f"checkpoint-{SAVE}"))
        write_weights(trainer.model, out / "resumed.safetensors")
        result["resumed_history"] = trainer.state.log_history

    phases = (("train", train), ("evaluate", evaluate), ("predict", predict), ("load", load), ("resume", resume))
    if case == "setfit":
        phases = setfit_phases(world, out, result, state)
    for name, body in phases:
        if "train" in result["errors"] and name != "train":
            result["errors"][name] = "not run: train failed"
            continue
        phase(name, body)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_s"] = round(usage.ru_utime + usage.ru_stime - cpu_since, 1)  # imports included where cpu_since is 0
    (out / "result.json").write_text(json.dumps(result, default=float))
    return result


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def logging_to(path: Path) -> int:
    """Send this process's stdout and stderr (file descriptors 1 and 2: the warnings and log lines of every case,
    more than a pipe holds) to ``path``; returns a duplicate of the former stderr. A test reading both sides' pipes
    one after the other would otherwise stall this side once its pipe is full."""
    import os

    sys.stdout.flush()
    sys.stderr.flush()
    former = os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    return former


def main(cases: list[str], world: Path, out: Path) -> None:
    """Every case of ``cases``, one after the other in this process (the imports paid once), each into OUT/CASE
    (``run_case``; its ``cpu_s`` its own CPU time); then OUT/process.json: the cases, the process's CPU time
    (imports included) and its wall time."""
    start = time.perf_counter()
    for case in cases:
        folder = out / case
        folder.mkdir(parents=True, exist_ok=True)
        run_case(case, world, folder, cpu_since=cpu_seconds())
    (out / "process.json").write_text(json.dumps({"cases": cases, "cpu_s": round(cpu_seconds(), 1),
                                                  "wall_s": round(time.perf_counter() - start, 1)}))


if __name__ == "__main__":
    import os

    out_dir = Path(sys.argv[3])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[1].split(",")
    if len(names) == 1:  # one case: OUT/result.json, its output where the caller reads it
        run_case(names[0], Path(sys.argv[2]), out_dir)
    else:  # several: OUT/CASE/result.json; the warnings and log lines of every case to OUT/job.log (a pipe fills)
        former_stderr = logging_to(out_dir / "job.log")
        try:
            main(names, Path(sys.argv[2]), out_dir)
        except BaseException:
            os.write(former_stderr, f"{traceback.format_exc()}(the job's log: {out_dir / 'job.log'})\n".encode())
            raise
