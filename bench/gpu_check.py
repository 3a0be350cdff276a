"""GPU check: trainwell against ``transformers.Trainer`` (and against itself) on a tiny Llama, one row per check.

Every check builds a tiny ``LlamaForCausalLM`` from a ``LlamaConfig`` (no download), trains a few steps with its own
temporary ``output_dir`` and a fresh Trainer, and reports pass/fail with the numbers both sides gave. Checks that
need a process group (DDP, FSDP) run in a subprocess each, on a one-rank group (NCCL on CUDA, gloo on the CPU);
trainwell selects DDP/FSDP only for several ranks, so the subprocess builds the backend the arguments would get
under a launcher (``--worker``). The exit status is the number of failed checks.

    python bench/gpu_check.py --out gpu.json          # on one GPU: every check, well under 10 minutes
    python bench/gpu_check.py --cpu-smoke --out r.json  # on the CPU: the device-specific checks are skipped

Tolerances: fp32 runs must be bit-identical (same kernels, same order). bf16 keeps 8 significant bits, so one
rounding of a logit is a relative error of up to 2**-8 (0.4%); the two Trainers run the same autocast graph, and the
few steps compound at most a few such roundings: logged losses must agree within 2% relative. tf32 (10 bits) and
torch.compile (fused kernels, other summation orders) get 1e-2 and 1e-3 relative.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

SKIP_CUDA = "skipped (needs CUDA)"
BF16_RTOL, TF32_RTOL, COMPILE_RTOL = 2e-2, 1e-2, 1e-3


# ---------------------------------------------------------------------------------------------- model, data, runs
def tiny_llama(dropout: float = 0.0) -> torch.nn.Module:
    """A 2-layer Llama (vocab 128, hidden 64), the same weights on every call."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attention_dropout=dropout, tie_word_embeddings=False)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def token_data(n: int = 48, seq: int = 16) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (n, seq), generator=g)
    return [{"input_ids": ids[i], "labels": ids[i].clone()} for i in range(n)]


def _in_order(cls: type) -> type:
    """The Trainer with a sequential train sampler, so both libraries see the same batches."""
    from torch.utils.data import SequentialSampler

    class InOrder(cls):  # type: ignore[misc, valid-type]
        def _get_train_sampler(self, *args: Any, **kwargs: Any) -> Any:
            return SequentialSampler(self.train_dataset)

    return InOrder


class Run:
    """One side's finished training: per-step logs, final weights, train metrics and the trainer."""

    def __init__(self, trainer: Any, metrics: dict[str, Any], trained_steps: int) -> None:
        self.trainer = trainer
        self.trained_steps = trained_steps  # optimizer steps this run took (a resume takes only the rest)
        self.metrics = metrics
        self.steps = [e for e in trainer.state.log_history if "loss" in e and "train_runtime" not in e]
        model = getattr(trainer, "model", None)
        state = model.state_dict() if model is not None and hasattr(model, "state_dict") else {}
        # an FSDP model's entries are DTensors: compare the full tensors
        self.weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float().cpu().clone()
                        for k, v in state.items()}

    def series(self, key: str) -> list[float]:
        return [float(e[key]) for e in self.steps if key in e]


def train(side: str, out: Path, *, cpu: bool, dropout: float = 0.0, resume: str | None = None,
          compute_metrics: Callable | None = None, **opts: Any) -> Run:
    """Train a tiny Llama with ``side`` ("trainwell" or "transformers") and return the :class:`Run`."""
    if side == "trainwell":
        import trainwell as lib
    else:
        import transformers as lib
    init_scale = opts.pop("_init_scale", None)
    base = dict(per_device_train_batch_size=4, per_device_eval_batch_size=8, max_steps=6, logging_steps=1,
                learning_rate=1e-3, warmup_steps=2, optim="adamw_torch", save_strategy="no", report_to="none",
                disable_tqdm=True, seed=0, max_grad_norm=1.0, use_cpu=cpu)
    args = lib.TrainingArguments(output_dir=str(out / side), **{**base, **opts})
    data = token_data()

    class CountSteps(lib.TrainerCallback):  # type: ignore[name-defined, misc]
        count = 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.count += 1

    counter = CountSteps()
    trainer = _in_order(lib.Trainer)(model=tiny_llama(dropout), args=args, train_dataset=data,
                                     eval_dataset=data[:16], compute_metrics=compute_metrics, callbacks=[counter])
    if init_scale is not None:
        _scaler(trainer)._init_scale = init_scale
    result = trainer.train(resume_from_checkpoint=resume)
    return Run(trainer, dict(result.metrics), counter.count)


def _scaler(trainer: Any) -> Any:
    backend = getattr(trainer, "backend", None)
    return backend.scaler if backend is not None else trainer.accelerator.scaler


def rel_diff(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two equally long series (inf when their lengths differ)."""
    if len(a) != len(b) or not a:
        return math.inf
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def weight_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys() or not a:
        return math.inf
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def row(name: str, ok: bool, detail: str, **numbers: Any) -> dict[str, Any]:
    return {"name": name, "status": "pass" if ok else "fail", "detail": detail, "numbers": numbers}


def skipped(name: str, why: str = SKIP_CUDA) -> dict[str, Any]:
    return {"name": name, "status": why, "detail": "", "numbers": {}}


# ---------------------------------------------------------------------------------------------- checks
def check_fp32(tmp: Path, cpu: bool) -> dict[str, Any]:
    """fp32 with optim="adamw_torch": per-step logs and final weights bit-identical to transformers.Trainer."""
    ours, theirs = (train(side, tmp, cpu=cpu) for side in ("trainwell", "transformers"))
    keys = ("loss", "grad_norm", "learning_rate", "epoch", "step")
    logs = [[{k: e.get(k) for k in keys} for e in run.steps] for run in (ours, theirs)]
    same_weights = ours.weights.keys() == theirs.weights.keys() and all(
        torch.equal(ours.weights[k], theirs.weights[k]) for k in ours.weights)
    ok = bool(logs[0]) and logs[0] == logs[1] and same_weights and bool(ours.weights)
    return row("fp32_bit_identical", ok, f"{len(logs[0])} logged steps, {len(ours.weights)} tensors",
               losses_trainwell=ours.series("loss"), losses_transformers=theirs.series("loss"),
               grad_norms_trainwell=ours.series("grad_norm"), grad_norms_transformers=theirs.series("grad_norm"),
               weights_compared=len(ours.weights), max_weight_diff=weight_diff(ours.weights, theirs.weights))


def _compare_losses(name: str, tmp: Path, cpu: bool, rtol: float, **opts: Any) -> dict[str, Any]:
    ours, theirs = (train(side, tmp, cpu=cpu, **opts) for side in ("trainwell", "transformers"))
    a, b = ours.series("loss"), theirs.series("loss")
    diff = rel_diff(a, b)
    return row(name, diff <= rtol, f"max relative loss difference {diff:.2e} (tolerance {rtol:g})",
               losses_trainwell=a, losses_transformers=b, max_rel_diff=diff, rtol=rtol)


def check_bf16(tmp: Path, cpu: bool) -> dict[str, Any]:
    return skipped("bf16_losses") if cpu else _compare_losses("bf16_losses", tmp, cpu, BF16_RTOL, bf16=True)


def check_tf32(tmp: Path, cpu: bool) -> dict[str, Any]:
    if cpu:
        return skipped("tf32")
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        result = _compare_losses("tf32", tmp, cpu, TF32_RTOL, tf32=True)
        result["numbers"]["allow_tf32_after_train"] = torch.backends.cuda.matmul.allow_tf32
        if not torch.backends.cuda.matmul.allow_tf32:
            result["status"], result["detail"] = "fail", "tf32=True left allow_tf32 off"
        return result
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = before


def check_compile(tmp: Path, cpu: bool) -> dict[str, Any]:
    if cpu:
        return skipped("torch_compile")
    try:
        return _compare_losses("torch_compile", tmp, cpu, COMPILE_RTOL, torch_compile=True)
    finally:
        torch._dynamo.reset()


def check_gradient_checkpointing(tmp: Path, cpu: bool) -> dict[str, Any]:
    """activation_checkpointing=True: the same losses and weights as transformers.Trainer with it, and as without."""
    ours, theirs = (train(side, tmp, cpu=cpu, activation_checkpointing=True) for side in ("trainwell", "transformers"))
    plain = train("trainwell", tmp / "plain", cpu=cpu)
    a, b, c = ours.series("loss"), theirs.series("loss"), plain.series("loss")
    diff, vs_plain = rel_diff(a, b), rel_diff(a, c)
    wdiff = weight_diff(ours.weights, theirs.weights)
    tol = 0.0 if cpu else 1e-5  # CUDA kernels may sum in another order when recomputing
    ok = diff <= tol and vs_plain <= max(tol, 1e-6) and wdiff <= max(tol, 1e-6)
    return row("gradient_checkpointing", ok, f"vs transformers {diff:.1e}, vs no checkpointing {vs_plain:.1e}",
               losses_trainwell=a, losses_transformers=b, losses_without=c, max_weight_diff=wdiff,
               gradient_checkpointing_on=bool(getattr(ours.trainer.model, "is_gradient_checkpointing", False)))


def check_fp16_scale(tmp: Path, cpu: bool) -> dict[str, Any]:
    """fp16 from a loss scale of 2**30: the first steps overflow and are skipped on both sides."""
    if cpu:
        return skipped("fp16_scaler")
    seen: dict[str, list[str]] = {"trainwell": [], "transformers": []}
    runs = {}
    for side in seen:
        def metrics(pred: Any, side: str = side) -> dict[str, float]:
            seen[side].append(str(pred.predictions.dtype))
            return {"n": float(len(pred.label_ids))}

        runs[side] = train(side, tmp, cpu=cpu, fp16=True, max_steps=12, skip_memory_metrics=False,
                           compute_metrics=metrics, _init_scale=2.0 ** 30)
        runs[side].trainer.evaluate()
    ours, theirs = runs["trainwell"], runs["transformers"]
    scales = [_scaler(run.trainer).get_scale() for run in (ours, theirs)]
    lrs = [run.series("learning_rate") for run in (ours, theirs)]
    norms = [run.series("grad_norm") for run in (ours, theirs)]
    finite = [[x for x in n if math.isfinite(x)] for n in norms]
    same_skips = [math.isfinite(x) for x in norms[0]] == [math.isfinite(x) for x in norms[1]]
    norm_diff = rel_diff(*finite) if finite[0] else math.inf
    memory = [sorted(k for k in run.metrics if "_mem_" in k) for run in (ours, theirs)]
    checks = {"scale": scales[0] == scales[1] and scales[0] < 2.0 ** 30, "lrs": lrs[0] == lrs[1] and bool(lrs[0]),
              "grad_norms": same_skips and norm_diff <= 1e-2 and max(finite[0], default=0) < 1e3,
              "memory_metrics": bool(memory[0]) and set(memory[1]) <= set(memory[0]),
              "float32_predictions": seen["trainwell"] == seen["transformers"] == ["float32"]}
    failed = [k for k, ok in checks.items() if not ok]
    return row("fp16_scaler", not failed, "failed: " + ", ".join(failed) if failed else "all sub-checks pass",
               scale_trainwell=scales[0], scale_transformers=scales[1], lrs_trainwell=lrs[0],
               lrs_transformers=lrs[1], grad_norms_trainwell=norms[0], grad_norms_transformers=norms[1],
               memory_trainwell=memory[0], memory_transformers=memory[1], prediction_dtypes=seen)


def _resume_row(name: str, tmp: Path, cpu: bool, steps: int = 8, **opts: Any) -> dict[str, Any]:
    """Train ``steps`` saving at half way, resume a fresh Trainer from there: logs and weights must be exact."""
    half = steps // 2
    full = train("trainwell", tmp / "full", cpu=cpu, max_steps=steps, save_strategy="steps", save_steps=half,
                 **opts)
    checkpoint = tmp / "full" / "trainwell" / f"checkpoint-{half}"
    resumed = train("trainwell", tmp / "resumed", cpu=cpu, max_steps=steps, resume=str(checkpoint), **opts)
    a, b = full.series("loss"), resumed.series("loss")
    wdiff = weight_diff(full.weights, resumed.weights)
    files = sorted(p.name for p in checkpoint.iterdir()) if checkpoint.is_dir() else []
    ok = len(a) == steps and a == b and wdiff == 0.0 and resumed.trained_steps == steps - half
    return row(name, ok, f"resumed at step {half} of {steps} ({resumed.trained_steps} steps after it): losses "
                         f"equal {a == b}, max weight diff {wdiff:.1e}", losses_uninterrupted=a, losses_resumed=b,
               steps_after_resume=resumed.trained_steps, max_weight_diff=wdiff, checkpoint_files=files)


def check_resume(tmp: Path, cpu: bool) -> dict[str, Any]:
    """A resume with dropout (its RNG state restored) is exact: fp16 on CUDA, fp32 on the CPU."""
    return _resume_row("resume_dropout", tmp, cpu, dropout=0.1, fp16=not cpu)


# ---------------------------------------------------------------------------------------------- process groups
def _one_rank_group(cpu: bool) -> None:
    import torch.distributed as dist

    if not cpu:
        torch.cuda.set_device(0)
    # on CUDA, gloo for CPU tensors too (FSDP offload's collectives), as trainwell's own process group
    dist.init_process_group("gloo" if cpu else "cuda:nccl,cpu:gloo", store=dist.HashStore(), rank=0, world_size=1)


def _force_backend(kind: str) -> None:
    """Make every Trainer of this process build ``kind`` ("ddp"/"fsdp"), as it would under a launcher."""
    import trainwell.backends as backends
    from trainwell.runtime.precision import Precision

    def build(args: Any) -> Any:
        precision = Precision.from_args(args, args.device)
        if kind == "fsdp":
            from trainwell.backends.fsdp import FSDPBackend

            return FSDPBackend(args, args.device, precision)
        from trainwell.backends.ddp import DDPBackend

        return DDPBackend(args, args.device, precision)

    backends.build_backend = build


def worker_ddp(tmp: Path, cpu: bool) -> dict[str, Any]:
    """DDP on one rank: the same grad norms (before clipping to 0.5) and losses as one device."""
    single = train("trainwell", tmp / "single", cpu=cpu, max_grad_norm=0.5)
    _one_rank_group(cpu)
    _force_backend("ddp")
    ddp = train("trainwell", tmp / "ddp", cpu=cpu, max_grad_norm=0.5)
    backend = type(ddp.trainer.backend).__name__
    norms = rel_diff(ddp.series("grad_norm"), single.series("grad_norm"))
    losses = rel_diff(ddp.series("loss"), single.series("loss"))
    ok = backend == "DDPBackend" and norms <= 1e-6 and losses <= 1e-6
    return row("ddp_clip_norm", ok, f"{backend}: grad norm diff {norms:.1e}, loss diff {losses:.1e}",
               grad_norms_ddp=ddp.series("grad_norm"), grad_norms_single=single.series("grad_norm"), backend=backend)


def worker_fsdp_resume(tmp: Path, cpu: bool) -> dict[str, Any]:
    """FSDP on one rank (bf16 on CUDA): a DCP checkpoint saved half way and resumed gives the same run."""
    _one_rank_group(cpu)
    _force_backend("fsdp")
    result = _resume_row("fsdp_dcp_resume", tmp, cpu, steps=6, fsdp="full_shard", bf16=not cpu)
    dcp = [f for f in result["numbers"]["checkpoint_files"] if f.endswith(".distcp") or "fsdp" in f.lower()]
    if not dcp:
        result["status"], result["detail"] = "fail", "no DCP shard files in the checkpoint: " + result["detail"]
    return result


def worker_fsdp_fp16(tmp: Path, cpu: bool) -> dict[str, Any]:
    """FSDP fp16 with gradient accumulation and async_save: unscaled grad norms as one device's; checkpoints land."""
    opts = dict(fp16=True, gradient_accumulation_steps=2, max_steps=4, save_strategy="steps", save_steps=2)
    single = train("trainwell", tmp / "single", cpu=cpu, **opts)
    _one_rank_group(cpu)
    _force_backend("fsdp")
    fsdp = train("trainwell", tmp / "fsdp", cpu=cpu, fsdp="full_shard", async_save=True, **opts)
    diff = rel_diff(fsdp.series("grad_norm"), single.series("grad_norm"))
    saved = sorted(p.name for p in (tmp / "fsdp" / "trainwell").glob("checkpoint-*"))
    ok = diff <= 1e-3 and saved == ["checkpoint-2", "checkpoint-4"]
    return row("fsdp_fp16_accumulation_async_save", ok, f"grad norm diff {diff:.1e}, saved {saved}",
               grad_norms_fsdp=fsdp.series("grad_norm"), grad_norms_single=single.series("grad_norm"))


def worker_fsdp_offload(tmp: Path, cpu: bool) -> dict[str, Any]:
    """FSDP with CPU offload: the losses of one device."""
    single = train("trainwell", tmp / "single", cpu=cpu)
    _one_rank_group(cpu)
    _force_backend("fsdp")
    offload = train("trainwell", tmp / "offload", cpu=cpu, fsdp="full_shard offload")
    diff = rel_diff(offload.series("loss"), single.series("loss"))
    return row("fsdp_offload", diff <= 1e-5, f"loss diff {diff:.1e}", losses_offload=offload.series("loss"),
               losses_single=single.series("loss"))


#: row name -> check, run in this process with a fresh Trainer and its own output_dir each
IN_PROCESS = {"fp32_bit_identical": check_fp32, "bf16_losses": check_bf16, "fp16_scaler": check_fp16_scale,
              "resume_dropout": check_resume, "gradient_checkpointing": check_gradient_checkpointing,
              "torch_compile": check_compile, "tf32": check_tf32}
#: name -> (worker, runs on the CPU too)
WORKERS = {"ddp_clip_norm": (worker_ddp, True), "fsdp_dcp_resume": (worker_fsdp_resume, True),
           "fsdp_fp16_accumulation_async_save": (worker_fsdp_fp16, False), "fsdp_offload": (worker_fsdp_offload, False)}



# ---------------------------------------------------------------------------------------------- driver
def _guarded(name: str, fn: Callable[[Path, bool], dict[str, Any]], tmp: Path, cpu: bool) -> dict[str, Any]:
    """Run one check; an exception is a failed row naming it."""
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the Trainers' printed logs; the table says what counts
            result = fn(tmp, cpu)
    except Exception as err:  # one broken check must not hide the others
        result = row(name, False, f"{type(err).__name__}: {err}"[:500])
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def run_worker(name: str, tmp: Path, cpu: bool, timeout: float) -> dict[str, Any]:
    """One process-group check in a fresh interpreter (its own process group, its own flags)."""
    out = tmp / "row.json"
    cmd = [sys.executable, __file__, "--worker", name, "--tmp", str(tmp)] + (["--cpu-smoke"] if cpu else [])
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return row(name, False, f"timed out after {timeout:.0f} s") | {"seconds": round(timeout, 1)}
    if out.exists():
        return json.loads(out.read_text())
    tail = (proc.stderr or proc.stdout)[-800:]
    return row(name, False, f"worker exited {proc.returncode} without a result: {tail}") | {
        "seconds": round(time.perf_counter() - start, 1)}


def run_all(cpu: bool, only: list[str] | None = None) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as root:
        for name, fn in IN_PROCESS.items():
            if only and name not in only:
                continue
            tmp = Path(root) / name
            result = _guarded(name, fn, tmp, cpu)
            rows.append(result)
            print(f"  {result['name']}: {result['status']} ({result.get('seconds', 0)} s)", flush=True)
        for name, (_, on_cpu) in WORKERS.items():
            if only and name not in only:
                continue
            result = skipped(name) if cpu and not on_cpu else run_worker(name, Path(root) / name, cpu, 240)
            rows.append(result)
            print(f"  {result['name']}: {result['status']} ({result.get('seconds', 0)} s)", flush=True)
    return rows


def print_table(rows: list[dict[str, Any]], device: str, seconds: float) -> None:
    width = max(len(r["name"]) for r in rows)
    print(f"\ntrainwell vs transformers.Trainer on {device} ({seconds:.0f} s)")
    for r in rows:
        print(f"{r['name']:<{width}}  {r['status']:<22}  {r['detail']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="run on the CPU; skip the CUDA-only checks")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    parser.add_argument("--only", nargs="*", help="run only these checks (names as in the table)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--tmp", type=Path, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:  # a process-group check, in its own interpreter: write its row, exit 0
        opts.tmp.mkdir(parents=True, exist_ok=True)
        result = _guarded(opts.worker, WORKERS[opts.worker][0], opts.tmp, opts.cpu_smoke)
        (opts.tmp / "row.json").write_text(json.dumps(result, default=str))
        return 0
    if not opts.cpu_smoke and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --cpu-smoke, or on a GPU machine")
    import transformers

    transformers.logging.set_verbosity_error()
    device = "cpu" if opts.cpu_smoke else torch.cuda.get_device_name(0)
    start = time.perf_counter()
    rows = run_all(opts.cpu_smoke, opts.only)
    seconds = time.perf_counter() - start
    print_table(rows, device, seconds)
    failed = sum(r["status"] == "fail" for r in rows)
    if opts.out:
        report = {"device": device, "torch": torch.__version__, "transformers": transformers.__version__,
                  "seconds": round(seconds, 1), "failed": failed, "rows": rows}
        opts.out.write_text(json.dumps(report, indent=1, default=str))
    return failed


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
