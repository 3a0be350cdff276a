"""The library matrix's bookkeeping: which ``transformers.Trainer`` subclasses the installed TRL,
sentence-transformers and setfit ship, which of them the matrix runs (and which it leaves out, why), and how two
runs' numbers are compared.

The classes are found at test time (:func:`shipped_trainers`, :func:`experimental_trainers`), so a new release that
adds a trainer fails ``test_every_shipped_trainer_is_in_the_matrix`` until it is given a case or a reason.
"""

from __future__ import annotations

import importlib
import math
import re
from importlib.util import find_spec
from pathlib import Path
from typing import Any

#: each class the matrix runs (module.qualname) -> the case of jobs/matrix_job.py that runs it, the route a user takes
CASES = {
    "trl.trainer.sft_trainer.SFTTrainer": "SFTTrainer",
    "trl.trainer.dpo_trainer.DPOTrainer": "DPOTrainer",
    "trl.trainer.kto_trainer.KTOTrainer": "KTOTrainer",
    "trl.trainer.reward_trainer.RewardTrainer": "RewardTrainer",
    "trl.trainer.grpo_trainer.GRPOTrainer": "GRPOTrainer",
    "trl.trainer.rloo_trainer.RLOOTrainer": "RLOOTrainer",
    "trl.trainer.distillation_trainer.DistillationTrainer": "DistillationTrainer",
    "sentence_transformers.sentence_transformer.trainer.SentenceTransformerTrainer": "SentenceTransformerTrainer",
    "sentence_transformers.cross_encoder.trainer.CrossEncoderTrainer": "CrossEncoderTrainer",
    "sentence_transformers.sparse_encoder.trainer.SparseEncoderTrainer": "SparseEncoderTrainer",
    "sentence_transformers.multi_vector_encoder.trainer.MultiVectorEncoderTrainer": "MultiVectorEncoderTrainer",
    # what setfit.Trainer (not a transformers.Trainer) trains the body with: run through setfit.Trainer
    "setfit.trainer.BCSentenceTransformersTrainer": "setfit",
}

#: each trl.experimental class the matrix runs (module.qualname, as experimental_trainers() finds it) -> its case of
#: jobs/experimental_job.py (all of them in one process per side)
EXPERIMENTAL_CASES = {
    "trl.experimental.orpo.orpo_trainer.ORPOTrainer": "ORPOTrainer",
    "trl.experimental.cpo.cpo_trainer.CPOTrainer": "CPOTrainer",
    "trl.experimental.tpo.tpo_trainer.TPOTrainer": "TPOTrainer",
    "trl.experimental.gkd.gkd_trainer.GKDTrainer": "GKDTrainer",
    "trl.experimental.gmpo.gmpo_trainer.GMPOTrainer": "GMPOTrainer",
    "trl.experimental.online_dpo.online_dpo_trainer.OnlineDPOTrainer": "OnlineDPOTrainer",
    # DPO whose callbacks get the reference model, with its BEMACallback updating the reference model
    "trl.experimental.bema_for_ref_model.dpo_trainer.DPOTrainer": "BEMADPOTrainer",
    "trl.experimental.a2po.a2po_trainer.A2POTrainer": "A2POTrainer",
    "trl.experimental.iw_opd.iw_opd_trainer.IWOPDTrainer": "IWOPDTrainer",
    "trl.experimental.sdpo.sdpo_trainer.SDPOTrainer": "SDPOTrainer",
    "trl.experimental.sdft.sdft_trainer.SDFTTrainer": "SDFTTrainer",
}

#: each trl.experimental class the matrix does not run -> why
EXPERIMENTAL_LEFT_OUT = {
    "trl.experimental.async_grpo.async_grpo_trainer.AsyncGRPOTrainer":
        "generates on a vLLM server (its rollout worker's VLLMClient at vllm_server_base_url): no vLLM here",
    "trl.experimental.async_distillation.async_distillation_trainer.AsyncDistillationTrainer":
        "generates on a vLLM server (its rollout worker's VLLMClient at vllm_server_base_url): no vLLM here",
    "trl.experimental.server_distillation.server_distillation_trainer.ServerDistillationTrainer":
        "its teacher's log-probabilities come from a vLLM server (teacher_model_server_url): no vLLM here",
    "trl.experimental.kto.__init__.KTOTrainer": "a deprecated alias of trl.KTOTrainer (promoted to the stable API), "
                                                "whose case is KTOTrainer",
    "trl.experimental.distillation.__init__.DistillationTrainer": "a deprecated alias of trl.DistillationTrainer "
                                                                  "(promoted to the stable API), whose case is "
                                                                  "DistillationTrainer",
    "trl.experimental.gold.gold_trainer.GOLDTrainer": "its dataset preparation tokenizes with byte offsets, "
                                                      "for ByteLevel BPE tokenizers only (NotImplementedError: "
                                                      "Cross-tokenizer ULD currently supports only ByteLevel BPE "
                                                      "tokenizers); the offline tiny tokenizer is word-level",
}

#: each shipped class the matrix does not run -> why (trl.experimental's: EXPERIMENTAL_LEFT_OUT)
LEFT_OUT = {
    "trl.trainer.base_trainer._BaseTrainer": "TRL's private base class (no route of its own; its subclasses run)",
    "sentence_transformers.base.trainer.BaseTrainer": "sentence-transformers' abstract base class (no model of its "
                                                      "own; its four subclasses run)",
}

LIBRARIES = ("trl", "sentence_transformers", "setfit")
TIMING = re.compile(r"(runtime|per_second|_time|total_flos)$")  # TRL logs step_time
#: SFTTrainer's running token count starts from 0 in every process and is not in a checkpoint (upstream as here)
NOT_RESUMED = ("num_tokens",)


def shipped_trainers() -> set[str]:
    """Every ``transformers.Trainer`` subclass defined in the installed libraries (their public names imported,
    then the subclass tree walked), as ``module.qualname``."""
    import transformers

    for library in LIBRARIES:
        if find_spec(library) is None:
            continue
        module = importlib.import_module(library)
        for name in getattr(module, "__all__", ()):
            getattr(module, name)  # TRL imports lazily: touching each public name loads its module
    found, todo = set(), [transformers.Trainer]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.split(".")[0] in LIBRARIES:
                found.add(f"{sub.__module__}.{sub.__qualname__}")
    return found


def experimental_trainers() -> set[str]:
    """The trainer classes under ``trl/experimental`` (read from the source, not imported: several need optional
    packages), as ``module.name``."""
    spec = find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        return set()
    root = Path(next(iter(spec.submodule_search_locations)))
    found = set()
    for path in sorted((root / "experimental").rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for name in re.findall(r"^class (\w+Trainer)\(", path.read_text(), flags=re.M):
            found.add(f"{module}.{name}")
    return found


def relative(value: float, other: float) -> float:
    """|other - value| / |value| (the absolute difference where ``value`` is 0)."""
    if value == other:
        return 0.0
    if math.isnan(value) or math.isnan(other):
        return math.inf
    return abs(other - value) / abs(value) if value else abs(other)


def largest(reference: Any, other: Any, where: str = "") -> float:
    """The largest relative difference between two nested structures of numbers (dicts, lists); timings aside.
    Raises ``AssertionError`` naming the place where their shapes or keys differ."""
    if isinstance(reference, dict):
        mine = {k for k in reference if not TIMING.search(k)}
        theirs = {k for k in other if not TIMING.search(k)} if isinstance(other, dict) else None
        assert mine == theirs, f"{where or 'top'}: keys differ: only upstream {sorted(mine - (theirs or set()))}, " \
                               f"only trainwell {sorted((theirs or set()) - mine)}"
        return max((largest(reference[k], other[k], f"{where}.{k}") for k in mine), default=0.0)
    if isinstance(reference, list):
        assert isinstance(other, list) and len(other) == len(reference), \
            f"{where}: {len(reference)} entries upstream, {len(other) if isinstance(other, list) else other!r} here"
        return max((largest(a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(reference, other))), default=0.0)
    if isinstance(reference, (int, float)) and not isinstance(reference, bool):
        assert isinstance(other, (int, float)), f"{where}: {reference!r} upstream, {other!r} here"
        return relative(float(reference), float(other))
    assert reference == other, f"{where}: {reference!r} upstream, {other!r} here"
    return 0.0


def training_entries(history: list[dict], after: int = 0) -> list[dict]:
    """The log entries of training steps after ``after`` (evaluation entries and the closing summary aside)."""
    return [e for e in history if e["step"] > after and not any(k.startswith("eval_") for k in e)
            and "train_runtime" not in e]


def evaluation_entries(history: list[dict]) -> list[dict]:
    """The log entries of evaluations."""
    return [e for e in history if any(k.startswith("eval_") for k in e)]


def summary(history: list[dict]) -> dict:
    """The closing summary of a ``train()`` (``train_loss`` ...), timings aside."""
    return {k: v for e in history if "train_runtime" in e for k, v in e.items() if not TIMING.search(k)}


def resumed_entries(history: list[dict], after: int) -> list[dict]:
    """The training entries after ``after``, without the keys that are not resumed by design (NOT_RESUMED)."""
    return [{k: v for k, v in e.items() if k not in NOT_RESUMED} for e in training_entries(history, after)]


def weights_difference(a: Path, b: Path) -> float:
    """The largest relative difference between two safetensors files of the same tensors (relative to the
    largest magnitude of each tensor)."""
    from safetensors.torch import load_file

    first, second = load_file(str(a)), load_file(str(b))
    assert sorted(first) == sorted(second), "the two models hold different tensors"
    worst = 0.0
    for key, tensor in first.items():
        scale = tensor.double().abs().max().item() or 1.0
        worst = max(worst, (tensor.double() - second[key].double()).abs().max().item() / scale)
    return worst
