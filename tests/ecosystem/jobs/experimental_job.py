"""``trl.experimental``'s trainers in the library matrix, all in one process per side:
``python experimental_job.py WORLD OUT [--patch] [--cases A,B]``.

Each case (CASES: ORPO, CPO, TPO, GKD, GMPO, OnlineDPO, DPO with the BEMA callback, A2PO, IWOPD, SDPO, SDFT) is
built on the tiny Llama
as TRL's documentation builds it and runs every phase of jobs/matrix_job.py (``run_case``: train 6 steps with a
checkpoint every 3, evaluate, predict, load, resume from step 3), one case after the other, writing
OUT/CASE/result.json in the matrix's format (its ``cpu_s`` is the case's own CPU time). One process for every case
keeps the imports (most of a case's time) to one per side. Writes OUT/process.json last: the cases run, the
process's CPU time (imports included) and its wall time. The warnings and log lines go to OUT/job.log; the pipe
gets one line per case.
"""

import json
import sys
import time
from pathlib import Path

START = time.perf_counter()

if "--patch" in sys.argv:
    import trainwell

    trainwell.patch_transformers()

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from matrix_job import (common, cpu_seconds, length_reward, llama_rows, logging_to, metrics_of,  # noqa: E402
                        run_case, transformers_outputs)
from world import preference_rows  # noqa: E402

#: the experimental cases, in the order they run (the names of tests/ecosystem/matrix.py's EXPERIMENTAL_CASES)
CASES = ("ORPOTrainer", "CPOTrainer", "TPOTrainer", "GKDTrainer", "GMPOTrainer", "OnlineDPOTrainer", "BEMADPOTrainer",
         "A2POTrainer", "IWOPDTrainer", "SDPOTrainer", "SDFTTrainer")
#: the teacher of GKD and IWOPD, built by main()
TEACHER = Path()
#: a chat template for GKD's ChatML collator (the tiny tokenizer has none): the turns' texts, space-separated
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"


def rows(kind: str) -> tuple:
    """(train, eval) data sets: ``triple`` (preference rows with a gold ``reference``: the chosen) or ``messages``
    (a user turn and an assistant turn), else matrix_job's kinds."""
    from datasets import Dataset

    if kind == "triple":
        data = [{**r, "reference": r["chosen"]} for r in preference_rows()]
    elif kind == "messages":
        data = [{"messages": [{"role": "user", "content": r["prompt"]},
                              {"role": "assistant", "content": r["chosen"]}]} for r in preference_rows()]
    else:
        return llama_rows(kind)
    return Dataset.from_list(data[:16]), Dataset.from_list(data[-8:])


def build(case: str, world: Path, out: Path, callbacks: list):
    """The trainer of ``case`` on the tiny Llama, writing its checkpoints under ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    llama = str(world / "llama")
    base = common(out)
    tokenizer = AutoTokenizer.from_pretrained(llama)
    if case in ("ORPOTrainer", "CPOTrainer"):
        from trl.experimental import cpo, orpo

        module = orpo if case == "ORPOTrainer" else cpo
        train, evals = rows("preference")
        config = getattr(module, case.replace("Trainer", "Config"))(**base, beta=0.1, max_length=32)
        return getattr(module, case)(model=AutoModelForCausalLM.from_pretrained(llama), args=config,
                                     processing_class=tokenizer, train_dataset=train, eval_dataset=evals,
                                     compute_metrics=metrics_of, callbacks=callbacks)
    if case == "TPOTrainer":
        from trl.experimental.tpo import TPOConfig, TPOTrainer

        train, evals = rows("triple")
        return TPOTrainer(model=llama, args=TPOConfig(**base, beta=0.1, max_length=32), processing_class=tokenizer,
                          train_dataset=train, eval_dataset=evals, compute_metrics=metrics_of, callbacks=callbacks)
    if case == "BEMADPOTrainer":
        from trl import DPOConfig
        from trl.experimental.bema_for_ref_model import BEMACallback, DPOTrainer

        train, evals = rows("preference")
        # θ₀ and the EMA snapped at step 4, BEMA weights every step after, the reference model takes them at steps
        # 5 and 6: after the checkpoint of step 3, since the callback keeps θ₀ and the EMA in memory only (no
        # checkpoint holds them, upstream as here), so a run resumed from step 3 is the uninterrupted run
        bema = BEMACallback(update_freq=1, update_after=4, update_ref_model=True, ref_model_update_freq=1,
                            ref_model_update_after=5)
        return DPOTrainer(model=AutoModelForCausalLM.from_pretrained(llama),
                          ref_model=AutoModelForCausalLM.from_pretrained(llama),
                          args=DPOConfig(**base, beta=0.1, max_length=32), processing_class=tokenizer,
                          train_dataset=train, eval_dataset=evals, compute_metrics=metrics_of,
                          callbacks=[*callbacks, bema])
    sampling = dict(per_device_eval_batch_size=4)
    teacher = str(TEACHER)  # main() built it: the tiny Llama of another seed
    if case == "GKDTrainer":
        from trl.experimental.gkd import GKDConfig, GKDTrainer

        tokenizer.chat_template = CHAT_TEMPLATE
        train, evals = rows("messages")
        config = GKDConfig(**{**base, **sampling}, max_new_tokens=4, max_length=32, lmbda=0.5, beta=0.5)
        return GKDTrainer(model=llama, teacher_model=teacher, args=config, processing_class=tokenizer,
                          train_dataset=train, eval_dataset=evals, callbacks=callbacks)
    if case == "IWOPDTrainer":
        from trl.experimental.iw_opd import IWOPDConfig, IWOPDTrainer

        tokenizer.chat_template = CHAT_TEMPLATE
        train, evals = rows("messages")
        config = IWOPDConfig(**{**base, **sampling}, max_completion_length=4, max_length=32)
        return IWOPDTrainer(model=llama, teacher_model=teacher, args=config, processing_class=tokenizer,
                            train_dataset=train, eval_dataset=evals, callbacks=callbacks)
    train, evals = rows("prompt")
    if case == "GMPOTrainer":
        from trl.experimental.gmpo import GMPOConfig, GMPOTrainer

        config = GMPOConfig(**{**base, **sampling}, max_completion_length=4, num_generations=2)
        return GMPOTrainer(model=llama, reward_funcs=length_reward, args=config, train_dataset=train,
                           eval_dataset=evals, callbacks=callbacks)
    if case == "OnlineDPOTrainer":
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        config = OnlineDPOConfig(**{**base, **sampling}, max_new_tokens=4, max_length=32, beta=0.1)
        return OnlineDPOTrainer(model=llama, reward_funcs=length_reward, args=config, processing_class=tokenizer,
                                train_dataset=train, eval_dataset=evals, callbacks=callbacks)
    if case == "A2POTrainer":
        from trl.experimental.a2po import A2POConfig, A2POTrainer

        # before training, 2 completions per prompt from the reference policy estimate each prompt's value
        config = A2POConfig(**{**base, **sampling}, max_completion_length=4, num_value_samples=2)
        return A2POTrainer(model=llama, reward_funcs=length_reward, args=config, processing_class=tokenizer,
                           train_dataset=train, eval_dataset=evals, callbacks=callbacks)
    if case == "SDPOTrainer":
        from trl.experimental.sdpo import SDPOConfig, SDPOTrainer

        # the teacher: the initial student (the default, an EMA of the student kept by a callback, is in no
        # checkpoint, upstream as here, so no resumed run could equal the uninterrupted one)
        config = SDPOConfig(**{**base, **sampling}, max_completion_length=4, num_generations=2,
                            teacher_model_kind="base")
        return SDPOTrainer(model=llama, reward_funcs=length_reward, args=config, processing_class=tokenizer,
                           train_dataset=train, eval_dataset=evals, callbacks=callbacks)
    if case == "SDFTTrainer":
        from datasets import Dataset
        from trl.experimental.sdft import SDFTConfig, SDFTTrainer

        # the teacher's prompt: the prompt with a privileged context; its top 8 logits (the default 100 is more
        # than the tiny vocabulary)
        train, evals = (Dataset.from_list([{**r, "privileged_context": "the cat sat on the mat"} for r in data])
                        for data in (train, evals))
        config = SDFTConfig(**{**base, **sampling}, max_completion_length=4, num_generations=2, distillation_topk=8)
        return SDFTTrainer(model=llama, args=config, processing_class=tokenizer, train_dataset=train,
                           eval_dataset=evals, callbacks=callbacks)
    raise SystemExit(f"unknown case {case!r}")


def probe(case: str, folder: Path) -> list:
    """Every case trains a causal LM: the saved folder by ``AutoModelForCausalLM``, its logits on PROBE."""
    return transformers_outputs(folder)


def main(world: Path, out: Path, cases: tuple) -> None:
    import trl.experimental  # noqa: F401  (the imports once, before the first case's clock)
    from world import build_tiny_llama

    global TEACHER
    TEACHER = build_tiny_llama(out / "teacher", seed=1)  # GKD's and IWOPD's (the student's own weights teach nothing)
    for case in cases:
        folder = out / case
        folder.mkdir(parents=True, exist_ok=True)
        run_case(case, world, folder, build=build, probe=probe, cpu_since=cpu_seconds())
    (out / "process.json").write_text(json.dumps({"cases": list(cases), "cpu_s": round(cpu_seconds(), 1),
                                                  "wall_s": round(time.perf_counter() - START, 1)}))


if __name__ == "__main__":
    import os
    import traceback

    out_dir = Path(sys.argv[2])
    out_dir.mkdir(parents=True, exist_ok=True)
    chosen = sys.argv[sys.argv.index("--cases") + 1].split(",") if "--cases" in sys.argv else CASES
    former_stderr = logging_to(out_dir / "job.log")
    try:
        main(Path(sys.argv[1]), out_dir, tuple(chosen))
    except BaseException:
        os.write(former_stderr, f"{traceback.format_exc()}(the job's log: {out_dir / 'job.log'})\n".encode())
        raise
    for case in chosen:  # one line per case where the test shows it
        errors = json.loads((out_dir / case / "result.json").read_text())["errors"]
        os.write(former_stderr, f"{case}: {'errors ' + json.dumps(errors) if errors else 'every phase ran'}\n".encode())
