"""Defaults and rules match upstream's (the installed ``transformers`` is the oracle), or differ on purpose.

Every deliberate difference is listed with its reason in ``trainwell.args.differences.FIELD_DIFFERENCES``, the table
the README shows; any other default that drifts from upstream fails ``test_field_defaults``.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import inspect
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import trainwell
from trainwell.args.differences import FIELD_DIFFERENCES
from helpers.launch import run_json, torchrun

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]

# the fields whose value after __post_init__ differs from upstream's on purpose: the one table of differences
DELIBERATE = {name for name, diff in FIELD_DIFFERENCES.items() if "value" in diff.aspects}


def _plain(value):
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _pair(tmp_path, **kwargs):
    ours = trainwell.TrainingArguments(output_dir=str(tmp_path), **kwargs)
    theirs = transformers.TrainingArguments(output_dir=str(tmp_path), **kwargs)
    return ours, theirs


def test_field_defaults(tmp_path):
    ours, theirs = _pair(tmp_path)
    common = ({f.name for f in dataclasses.fields(ours)} & {f.name for f in dataclasses.fields(theirs)})
    common.discard("disable_tqdm")  # follows each library's own logger level (other tests change transformers')
    differ = {name for name in common if _plain(getattr(ours, name)) != _plain(getattr(theirs, name))}
    assert differ == DELIBERATE, "update trainwell/args/differences.py and the README table, or fix the default"


def test_report_to_defaults_to_none_like_current_upstream(tmp_path):
    ours, theirs = _pair(tmp_path)
    assert ours.report_to == theirs.report_to == []


@pytest.mark.parametrize("metric", ["loss", "eval_loss", "eval_ce_loss", "nll_loss", "accuracy", "eval_f1", "lossy"])
def test_greater_is_better_rule(tmp_path, metric):
    ours, theirs = _pair(tmp_path, metric_for_best_model=metric)
    assert ours.greater_is_better == theirs.greater_is_better == (not metric.endswith("loss"))


def test_greater_is_better_defaults_to_the_loss_with_load_best_model_at_end(tmp_path):
    ours, theirs = _pair(tmp_path, load_best_model_at_end=True, eval_strategy="steps", save_steps=10, eval_steps=5)
    assert ours.metric_for_best_model == theirs.metric_for_best_model == "loss"
    assert ours.greater_is_better is theirs.greater_is_better is False


def test_load_best_model_at_end_with_epoch_eval_and_the_default_save_strategy_is_refused(tmp_path):
    errors = []
    for lib in (trainwell, transformers):
        with pytest.raises(ValueError, match="save") as info:
            lib.TrainingArguments(output_dir=str(tmp_path), load_best_model_at_end=True, eval_strategy="epoch")
        errors.append(str(info.value))
    assert all("match" in e for e in errors)  # both say the strategies must match
    ours, theirs = _pair(tmp_path, load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch")
    assert ours.load_best_model_at_end and theirs.load_best_model_at_end


def test_hyperparameter_search_n_trials_default():
    ours = inspect.signature(trainwell.Trainer.hyperparameter_search).parameters["n_trials"].default
    theirs = inspect.signature(transformers.Trainer.hyperparameter_search).parameters["n_trials"].default
    assert ours == theirs == 20


# ------------------------------------------------------------------------------------- label_names for QA models
class TinyForQuestionAnswering(nn.Module):
    """Shaped like a transformers QA head: start/end logits, loss from start_positions/end_positions."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(10, 4)
        self.qa = nn.Linear(4, 2)

    def forward(self, input_ids, start_positions=None, end_positions=None):
        start, end = self.qa(self.emb(input_ids)).unbind(-1)
        out = {"start_logits": start, "end_logits": end}
        if start_positions is not None:
            out["loss"] = (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2
        return out


def _qa_rows():
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(0, 10, (6,), generator=g), "start_positions": torch.tensor(i % 6),
             "end_positions": torch.tensor((i + 2) % 6)} for i in range(5)]


def test_label_names_inferred_for_question_answering(tmp_path):
    results = []
    for lib in (trainwell, transformers):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                     per_device_eval_batch_size=2)
        trainer = lib.Trainer(model=TinyForQuestionAnswering(), args=args, eval_dataset=_qa_rows())
        assert trainer.label_names == ["start_positions", "end_positions"]
        out = trainer.predict(_qa_rows())
        results.append((out.metrics["test_loss"], out.label_ids))
    (loss_a, labels_a), (loss_b, labels_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert [list(x) for x in labels_a] == [list(x) for x in labels_b]


def test_label_names_of_a_plain_model_and_an_explicit_list(tmp_path):
    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 1)

        def forward(self, x, labels=None, label_weights=None):
            return {"logits": self.lin(x)}

    for lib in (trainwell, transformers):
        args = lib.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
        assert lib.Trainer(model=Plain(), args=args).label_names == ["labels", "label_weights"]
        args = lib.TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, label_names=["y"])
        assert lib.Trainer(model=Plain(), args=args).label_names == ["y"]


class InputOnly(nn.Module):
    """Shaped like sentence-transformers' models: ``forward(input, **kwargs)``, no label parameter."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)

    def forward(self, input, **kwargs):
        return {"logits": self.lin(input).squeeze(-1)}


class KwargsOnly(InputOnly):
    def forward(self, **kwargs):
        return {"logits": self.lin(kwargs["input"]).squeeze(-1)}


def test_label_names_inferred_from_forward_as_upstream(tmp_path):
    """No label parameter: ``[]`` as upstream (``forward(input, **kwargs)`` too); only a forward taking nothing but
    ``**kwargs`` keeps trainwell's documented ``["labels"]``. Evaluating the input-only model then gives upstream's
    predictions (before, ``["labels"]`` made the loop ask for labels the rows never have)."""
    rows = [{"input": torch.tensor([float(i), 1.0])} for i in range(5)]
    outs = {}
    for lib in (trainwell, transformers):
        args = lib.TrainingArguments(output_dir=str(tmp_path / lib.__name__), report_to="none", use_cpu=True,
                                     per_device_eval_batch_size=2, remove_unused_columns=False)
        trainer = lib.Trainer(model=InputOnly(), args=args, data_collator=lambda b: {
            "input": torch.stack([r["input"] for r in b])})
        assert trainer.label_names == []
        outs[lib.__name__] = trainer.predict(rows)
        generic = lib.Trainer(model=KwargsOnly(), args=args).label_names
        assert generic == (["labels"] if lib is trainwell else [])
    ours, theirs = outs["trainwell"], outs["transformers"]
    assert ours.label_ids is None and theirs.label_ids is None
    assert torch.allclose(torch.as_tensor(ours.predictions), torch.as_tensor(theirs.predictions))
    assert "test_loss" not in ours.metrics and "test_loss" not in theirs.metrics


# ------------------------------------------------------------------------------------- Seq2SeqTrainer.predict
class Reg(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(2, 1)

    def forward(self, x, labels=None):
        pred = self.lin(x).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels), "logits": pred}


def test_seq2seq_predict_metric_prefix_is_test(tmp_path):
    rows = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(5)]
    keys, losses = [], []
    for lib in (trainwell, transformers):
        args = lib.Seq2SeqTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
        trainer = lib.Seq2SeqTrainer(model=Reg(), args=args)
        metrics = trainer.predict(rows).metrics
        keys.append(sorted(k for k in metrics if k.startswith("test_") and "runtime" not in k
                           and "per_second" not in k and "preparation" not in k))
        losses.append(metrics["test_loss"])
    assert keys[0] == keys[1] == ["test_loss"]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


# ---------------------------------------------------------------------------------------------- sharded_ddp
def test_sharded_ddp_cpu_offload_spelling(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        args = trainwell.TrainingArguments(output_dir=str(tmp_path), sharded_ddp="zero_dp_2 cpu_offload")
        listed = trainwell.TrainingArguments(output_dir=str(tmp_path), sharded_ddp=["zero_dp_3", "cpu_offload"])
    assert [o.value for o in args.fsdp] == ["shard_grad_op", "offload"]
    assert [o.value for o in listed.fsdp] == ["full_shard", "offload"]


def test_fp16_with_sharded_ddp_on_cpu_is_the_fp16_on_cpu_error(tmp_path):
    with pytest.raises(ValueError) as plain:
        trainwell.TrainingArguments(output_dir=str(tmp_path), fp16=True, use_cpu=True)
    with pytest.raises(ValueError) as sharded, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainwell.TrainingArguments(output_dir=str(tmp_path), fp16=True, use_cpu=True, sharded_ddp="zero_dp_2")
    assert str(plain.value) == str(sharded.value)
    assert "fp16 mixed precision requires a GPU" in str(sharded.value)


@pytest.mark.slow
@pytest.mark.distributed
def test_fp16_with_sharded_ddp_zero_dp_2_trains_like_ddp_fp16(tmp_path):
    """Seed 002's ``--fp16 --sharded_ddp zero_dp_2`` is no longer refused: FSDP (shard_grad_op) with a sharded grad
    scaler, 2 gloo ranks; the CPU check of TrainingArguments is bypassed after construction to reach that path."""
    job = tmp_path / "job.py"
    job.write_text(f"""
import json, os, sys, warnings
import torch
sys.path.insert(0, {str(ROOT / "tests" / "distributed")!r})
from worker import TinyNet
from trainwell import Trainer, TrainingArguments
warnings.simplefilter("ignore")
out = {{}}
for name, sharded in (("ddp", None), ("zero_dp_2", "zero_dp_2")):
    torch.manual_seed(0)
    data = [{{"x": torch.randn(4), "labels": torch.randn(())}} for _ in range(32)]
    args = TrainingArguments(output_dir={str(tmp_path)!r} + "/" + name, use_cpu=True, per_device_train_batch_size=4,
                             max_steps=4, learning_rate=0.05, save_strategy="no", report_to="none",
                             disable_tqdm=True, logging_steps=1, sharded_ddp=sharded)
    args.fp16 = True
    trainer = Trainer(model=TinyNet(), args=args, train_dataset=data)
    trainer.train()
    out[name] = {{"backend": type(trainer.backend).__name__, "scaler": type(trainer.backend.scaler).__name__,
                 "scale": trainer.backend.scaler.get_scale(),
                 "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}}
if os.environ["RANK"] == "0":
    open({str(tmp_path / "result.json")!r}, "w").write(json.dumps(out))
""")
    result = run_json(torchrun(job), tmp_path / "result.json", "the 2-rank fp16 job", timeout=600)
    ddp, zero = result["ddp"], result["zero_dp_2"]
    assert ddp["backend"] == "DDPBackend" and zero["backend"] == "FSDPBackend"
    assert zero["scaler"] == "ShardedGradScaler" and zero["scale"] == ddp["scale"]  # the same skipped steps
    # fp16 rounds differently in FSDP (sharded fp16 gradients, reduce-scatter) and DDP (all-reduce): the curves agree
    # to fp16 noise, which grows over the steps (1.1% at step 4 with the batches accelerate gives each rank)
    assert zero["losses"][0] == pytest.approx(ddp["losses"][0], rel=1e-3)
    assert zero["losses"] == pytest.approx(ddp["losses"], rel=2e-2)


# ---------------------------------------------------------------------------------------------- HfArgumentParser
@dataclasses.dataclass
class ScriptArgs:
    flag: bool
    maybe: bool | None = None
    on: bool = True


def test_bool_field_without_default_is_an_optional_false_flag():
    for lib in (trainwell, transformers):
        parser = lib.HfArgumentParser(ScriptArgs)
        (args,) = parser.parse_args_into_dataclasses([])
        assert (args.flag, args.maybe, args.on) == (False, None, True)
        (args,) = parser.parse_args_into_dataclasses(["--flag", "--no_on"])
        assert (args.flag, args.on) == (True, False)
        (args,) = parser.parse_args_into_dataclasses(["--flag", "false", "--maybe", "true"])
        assert (args.flag, args.maybe) == (False, True)


# ---------------------------------------------------------------------------------------------- not implemented
def test_unimplemented_training_switches_are_refused(tmp_path):
    """Switches trainwell cannot honour are refused with the reason (the full list: tests/test_no_stub_fields.py)."""
    if importlib.util.find_spec("liger_kernel") is None:
        with pytest.raises(NotImplementedError, match="use_liger_kernel=True is not supported: it needs the "):
            trainwell.TrainingArguments(output_dir=str(tmp_path), use_liger_kernel=True)
    with pytest.raises(ValueError, match="optim_target_modules is only used by the GaLore and APOLLO"):
        trainwell.TrainingArguments(output_dir=str(tmp_path), optim_target_modules=["attn"])
    with pytest.raises(NotImplementedError, match="jit_mode_eval=True is not supported"):
        trainwell.TrainingArguments(output_dir=str(tmp_path), jit_mode_eval=True)


def test_no_switch_is_ignored_silently(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="trainwell.args"):
        args = trainwell.TrainingArguments(output_dir=str(tmp_path), torch_empty_cache_steps=3,
                                           neftune_noise_alpha=5.0)
    assert "no effect" not in caplog.text and args.neftune_noise_alpha == 5.0


def test_deliberate_differences_are_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Differences from the upstream Trainer", 1)[1].split("\n## ", 1)[0]
    for name in DELIBERATE:
        assert f"`{name}`" in section, name
