"""Tests of evaluate() / predict() / evaluation_loop (trainwell.loops.eval_loop)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import types

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from helpers.launch import free_port
from trainwell import Trainer, TrainingArguments
from trainwell.callbacks import TrainerCallback
from trainwell.loops import eval_loop
from trainwell.loops.accumulate import OutputAccumulator, pad_and_concatenate
from trainwell.loops.contract import EvalLoopTrainer
from trainwell.loops.gather import gather_across_ranks
from trainwell.runtime.memory import TrainerMemoryTracker

torch.set_num_threads(1)

BATCH = 4
VOCAB = 11
CLASSES = 5


# ------------------------------------------------------------------------------------------------ models and data


class TokenModel(nn.Module):
    """Token classification: logits [batch, seq, CLASSES]; optional extra outputs to test structure handling."""

    def __init__(self, extra: bool = False, style: str = "dict") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(VOCAB, 8)
        self.head = nn.Linear(8, CLASSES)
        self.extra = extra
        self.style = style

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None):
        hidden = self.emb(input_ids)
        logits = self.head(hidden)
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.reshape(-1, CLASSES), labels.reshape(-1), ignore_index=-100)
        out = {"loss": loss, "logits": logits}
        if self.extra:
            out["heads"] = (hidden.sum(-1), hidden[:, 0, :])  # [b, L] and [b, 8]
            out["aux"] = {"pooled": hidden.mean(1)}
            out["past_key_values"] = hidden * 2
        if self.style == "tuple":
            return tuple(v for v in out.values() if v is not None)
        if self.style == "object":
            return Output(**{k: v for k, v in out.items()})
        return {k: v for k, v in out.items() if v is not None}


@dataclasses.dataclass
class Output:
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None


def ragged_dataset(num_batches: int = 3, last: int = 2) -> list[dict[str, torch.Tensor]]:
    """Items whose sequence length is constant inside a batch of BATCH and differs between batches."""
    gen = torch.Generator().manual_seed(1)
    items = []
    lengths = [3, 6, 4, 5][:num_batches]
    for b, length in enumerate(lengths):
        count = BATCH if b < num_batches - 1 else last
        for _ in range(count):
            ids = torch.randint(0, VOCAB, (length,), generator=gen)
            labels = torch.randint(0, CLASSES, (length,), generator=gen)
            labels[-1] = -100
            items.append({"input_ids": ids, "labels": labels})
    return items


def direct_forward(model: nn.Module, data: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Per-batch outputs of a plain forward pass over the same batches."""
    model.eval()
    outs = []
    with torch.no_grad():
        for batch in DataLoader(data, batch_size=BATCH):
            outs.append({"batch": batch, "out": model(**batch)})
    return outs


# ------------------------------------------------------------------------------------------------ the trainer


class RecordingHandler:
    """A callback handler that records the events it receives."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []
        self.eval_dataloader = None

    def _record(self, name, args, state, control, **kwargs):
        self.events.append((name, kwargs))
        return control

    def on_prediction_step(self, args, state, control, **kwargs):
        return self._record("on_prediction_step", args, state, control, **kwargs)

    def on_evaluate(self, args, state, control, **kwargs):
        return self._record("on_evaluate", args, state, control, **kwargs)

    def on_predict(self, args, state, control, **kwargs):
        return self._record("on_predict", args, state, control, **kwargs)


def _state():
    try:
        from trainwell.utils.trainer_state import TrainerControl, TrainerState

        return TrainerState(), TrainerControl()
    except ImportError:
        return types.SimpleNamespace(epoch=None, global_step=0, log_history=[]), types.SimpleNamespace()


class FakeTrainer:
    """Exactly the contract of the evaluation functions (EvalLoopTrainer), with a plain DataLoader and default
    collation; the upstream method names delegate to trainwell.loops.eval_loop as the Trainer's do."""

    def __init__(self, model, *, eval_dataset=None, compute_metrics=None, preprocess_logits_for_metrics=None,
                 label_names=("labels",), **arg_overrides):
        defaults = dict(per_device_eval_batch_size=BATCH, eval_batch_size=BATCH, prediction_loss_only=False,
                        eval_accumulation_steps=None, include_for_metrics=[], batch_eval_metrics=False,
                        eval_do_concat_batches=True, past_index=-1, label_names=None, skip_memory_metrics=True,
                        world_size=1, process_index=0, use_legacy_prediction_loop=False,
                        logging_nan_inf_filter=True, eval_use_gather_object=False)
        defaults.update(arg_overrides)
        self.args = types.SimpleNamespace(**defaults)
        self.model = model
        self.state, self.control = _state()
        self.callback_handler = RecordingHandler()
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.eval_dataset = eval_dataset
        self.label_names = list(label_names)
        self.can_return_loss = False
        self._memory_tracker = TrainerMemoryTracker(self.args.skip_memory_metrics)
        self.backend = types.SimpleNamespace(autocast=contextlib.nullcontext)
        self.optimizer = None
        self._past = None
        self.logged: list[dict] = []

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        return eval_loop.run_evaluate(self, eval_dataset, ignore_keys, metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix="test"):
        return eval_loop.run_predict(self, test_dataset, ignore_keys, metric_key_prefix)

    def get_eval_dataloader(self, eval_dataset=None):
        return eval_loop.eval_dataloader(self, eval_dataset)

    def get_test_dataloader(self, test_dataset):
        return eval_loop.prediction_dataloader(self, test_dataset)

    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None,
                        metric_key_prefix="eval"):
        return eval_loop.run_evaluation(self, dataloader, description, prediction_loss_only, ignore_keys,
                                        metric_key_prefix, model=self.model)

    prediction_loop = evaluation_loop

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        return eval_loop.prediction_step(self, model, inputs, prediction_loss_only, ignore_keys)

    def log(self, logs):
        self.logged.append(dict(logs))

    def _prepare_inputs(self, inputs):
        return dict(inputs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        if isinstance(outputs, dict):
            loss = outputs["loss"]
        elif isinstance(outputs, tuple):
            loss = outputs[0]
        else:
            loss = outputs.loss
        return (loss, outputs) if return_outputs else loss

    def _get_dataloader(self, dataset, description, batch_size, sampler_fn=None, is_training=False,
                        dataloader_key=None):
        if hasattr(dataset, "__len__") and len(dataset) == 0:
            raise ValueError(f"The {description} is empty")
        return DataLoader(dataset, batch_size=batch_size, shuffle=False)

    def _get_eval_sampler(self, dataset):
        return None


_OUTPUT_DIR = tempfile.TemporaryDirectory()


class Recorder(TrainerCallback):
    """Records the evaluation events the Trainer fires."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    def on_prediction_step(self, args, state, control, **kwargs):
        self.events.append(("on_prediction_step", kwargs))

    def on_evaluate(self, args, state, control, **kwargs):
        self.events.append(("on_evaluate", kwargs))

    def on_predict(self, args, state, control, **kwargs):
        self.events.append(("on_predict", kwargs))


def make_trainer(model=None, *, eval_dataset=None, compute_metrics=None, preprocess_logits_for_metrics=None,
                 **arg_overrides) -> Trainer:
    """The real Trainer on the CPU, with a Recorder callback at ``trainer.recorder``."""
    args = TrainingArguments(output_dir=_OUTPUT_DIR.name, per_device_eval_batch_size=BATCH, use_cpu=True,
                             report_to="none", disable_tqdm=True, **arg_overrides)
    recorder = Recorder()
    trainer = Trainer(model=model if model is not None else TokenModel(), args=args, eval_dataset=eval_dataset,
                      compute_metrics=compute_metrics, preprocess_logits_for_metrics=preprocess_logits_for_metrics,
                      callbacks=[recorder])
    trainer.recorder = recorder
    return trainer


def make_fake_trainer(model=None, **kwargs) -> FakeTrainer:
    """The bare contract (used where the real Trainer would set up its own process group or devices)."""
    return FakeTrainer(model if model is not None else TokenModel(), **kwargs)


def expected_padded(outs, key, fill=-100):
    """Concatenate per-batch tensors padded on dim 1 (the reference for the gathered arrays)."""
    pieces = [o[key].numpy() if key != "labels" else o.numpy() for o in outs]
    width = max(p.shape[1] for p in pieces)
    padded = [np.concatenate([p, np.full((p.shape[0], width - p.shape[1]) + p.shape[2:], fill, p.dtype)], 1)
              for p in pieces]
    return np.concatenate(padded)


def assert_nested_equal(a, b):
    """Same structure (types, keys, lengths) and identical arrays."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_nested_equal(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_nested_equal(x, y)
    else:
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------ tests


def test_predict_matches_direct_forward_with_ragged_padding():
    data = ragged_dataset()
    trainer = make_trainer()
    out = trainer.predict(data)
    ref = direct_forward(TokenModel(), data)
    logits = expected_padded([r["out"] for r in ref], "logits")
    labels = expected_padded([r["batch"]["labels"] for r in ref], "labels")
    assert out.predictions.shape == (len(data), 6, CLASSES) == logits.shape
    np.testing.assert_allclose(out.predictions, logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(out.label_ids, labels)
    # the first batch has length 3: positions 3..5 are padding
    assert (out.predictions[:BATCH, 3:] == -100).all() and (out.label_ids[:BATCH, 3:] == -100).all()
    assert out.label_ids.dtype == np.int64
    weights = [len(r["batch"]["labels"]) for r in ref]
    expected_loss = np.average([r["out"]["loss"].item() for r in ref], weights=weights)
    assert out.metrics["test_loss"] == pytest.approx(expected_loss, rel=1e-6)
    for key in ("test_runtime", "test_samples_per_second", "test_steps_per_second"):
        assert key in out.metrics
    names = [name for name, _ in trainer.recorder.events]
    assert names == ["on_prediction_step"] * 3 + ["on_predict"]
    assert trainer.recorder.events[-1][1]["metrics"] is out.metrics


def test_evaluate_metrics_log_epoch_and_compute_metrics_arrays():
    data = ragged_dataset()
    seen = {}

    def accuracy(eval_pred):
        seen["pred"] = eval_pred
        preds = eval_pred.predictions.argmax(-1)
        mask = eval_pred.label_ids != -100
        return {"accuracy": np.float32((preds[mask] == eval_pred.label_ids[mask]).mean())}

    trainer = make_trainer(eval_dataset=data, compute_metrics=accuracy, include_for_metrics=["inputs", "loss"])
    trainer.state.epoch = 1.5
    metrics = trainer.evaluate()
    ref = direct_forward(TokenModel(), data)
    pred = seen["pred"]
    np.testing.assert_allclose(pred.predictions, expected_padded([r["out"] for r in ref], "logits"), atol=1e-6)
    np.testing.assert_array_equal(pred.label_ids, expected_padded([r["batch"]["labels"] for r in ref], "labels"))
    np.testing.assert_array_equal(pred.inputs, expected_padded([r["batch"]["input_ids"] for r in ref], "labels"))
    per_sample = np.repeat([r["out"]["loss"].item() for r in ref], [len(r["batch"]["labels"]) for r in ref])
    np.testing.assert_allclose(pred.losses, per_sample, rtol=1e-6)
    assert isinstance(metrics["eval_accuracy"], float)
    assert metrics["epoch"] == 1.5
    # upstream's order (the keys a script prints): the loss, compute_metrics' keys, then the speed and the epoch
    assert list(metrics) == ["eval_loss", "eval_accuracy", "eval_runtime", "eval_samples_per_second",
                             "eval_steps_per_second", "epoch"]
    assert trainer.state.log_history[-1] == {**metrics, "step": 0}
    name, kwargs = trainer.recorder.events[-1]
    assert name == "on_evaluate" and kwargs["metrics"] is metrics


def test_dict_eval_dataset_gives_one_loss_per_name():
    first, second = ragged_dataset(2, BATCH), ragged_dataset(3, 1)
    trainer = make_trainer(eval_dataset={"first": first, "second": second})
    metrics = trainer.evaluate()
    single_first = make_trainer().evaluate(first)["eval_loss"]
    single_second = make_trainer().evaluate(second)["eval_loss"]
    assert metrics["eval_first_loss"] == pytest.approx(single_first)
    assert metrics["eval_second_loss"] == pytest.approx(single_second)
    assert "eval_first_runtime" in metrics and "eval_loss" not in metrics
    passed = make_trainer().evaluate({"x": first}, metric_key_prefix="val")
    assert passed["val_x_loss"] == pytest.approx(single_first)


def test_prediction_loss_only_returns_no_predictions():
    trainer = make_trainer(prediction_loss_only=True)
    out = trainer.predict(ragged_dataset())
    assert out.predictions is None and out.label_ids is None
    assert "test_loss" in out.metrics


def test_evaluate_without_compute_metrics_gathers_no_predictions():
    calls = []
    trainer = make_trainer(eval_dataset=ragged_dataset())
    original = trainer.prediction_step
    trainer.prediction_step = lambda *a, **k: calls.append(a[2]) or original(*a, **k)
    trainer.evaluate()
    assert calls == [True, True, True]


def test_ignore_keys_and_config_keys_to_ignore_at_inference():
    data = ragged_dataset(2, BATCH)
    model = TokenModel(extra=True)
    full = make_trainer(model).predict(data).predictions
    assert isinstance(full, tuple) and len(full) == 4  # logits, heads, aux, past_key_values
    only_logits = make_trainer(model).predict(data, ignore_keys=["heads", "aux", "past_key_values"]).predictions
    assert isinstance(only_logits, np.ndarray)
    np.testing.assert_array_equal(only_logits, full[0])
    model.config = types.SimpleNamespace(keys_to_ignore_at_inference=["past_key_values", "aux"])
    preds = make_trainer(model).predict(data).predictions
    assert len(preds) == 2
    np.testing.assert_array_equal(preds[1][0], full[1][0])


def test_nested_outputs_keep_structure_and_pad():
    data = ragged_dataset()
    preds = make_trainer(TokenModel(extra=True)).predict(data, ignore_keys=[]).predictions
    logits, heads, aux, past = preds
    assert isinstance(heads, tuple) and len(heads) == 2 and isinstance(aux, dict) and set(aux) == {"pooled"}
    n = len(data)
    assert logits.shape == (n, 6, CLASSES) and heads[0].shape == (n, 6) and heads[1].shape == (n, 8)
    assert aux["pooled"].shape == (n, 8) and past.shape == (n, 6, 8)
    assert (heads[0][:BATCH, 3:] == -100).all() and (heads[0][:BATCH, :3] != -100).all()
    ref = direct_forward(TokenModel(extra=True), data)
    np.testing.assert_allclose(aux["pooled"], np.concatenate([r["out"]["aux"]["pooled"] for r in ref]), atol=1e-6)


@pytest.mark.parametrize("style", ["tuple", "object"])
def test_tuple_and_object_outputs(style):
    data = ragged_dataset()
    reference = make_trainer(TokenModel()).predict(data)
    out = make_trainer(TokenModel(style=style)).predict(data)
    np.testing.assert_array_equal(out.predictions, reference.predictions)
    assert out.metrics["test_loss"] == pytest.approx(reference.metrics["test_loss"])


def test_eval_accumulation_steps_gives_identical_results():
    data = ragged_dataset(4, 3)
    plain = make_trainer(TokenModel(extra=True)).predict(data)
    accumulated = make_trainer(TokenModel(extra=True), eval_accumulation_steps=2).predict(data)
    assert_nested_equal(plain.predictions, accumulated.predictions)
    np.testing.assert_array_equal(plain.label_ids, accumulated.label_ids)
    assert plain.metrics["test_loss"] == accumulated.metrics["test_loss"]


def test_eval_do_concat_batches_false_returns_batches():
    data = ragged_dataset()
    out = make_trainer(eval_do_concat_batches=False).predict(data)
    assert isinstance(out.predictions, list) and [p.shape for p in out.predictions] == [
        (4, 3, CLASSES), (4, 6, CLASSES), (2, 4, CLASSES)]
    assert [lab.shape for lab in out.label_ids] == [(4, 3), (4, 6), (2, 4)]


def test_batch_eval_metrics_called_per_batch():
    calls = []

    def running(eval_pred, compute_result):
        calls.append((type(eval_pred.predictions), tuple(eval_pred.label_ids.shape), compute_result))
        return {"batches": len(calls)} if compute_result else None

    trainer = make_trainer(eval_dataset=ragged_dataset(), compute_metrics=running, batch_eval_metrics=True)
    metrics = trainer.evaluate()
    assert calls == [(torch.Tensor, (4, 3), False), (torch.Tensor, (4, 6), False), (torch.Tensor, (2, 4), True)]
    assert metrics["eval_batches"] == 3 and "eval_loss" in metrics


def test_preprocess_logits_for_metrics():
    seen = {}

    def argmax(logits, labels):
        seen["labels"] = labels.shape
        return logits.argmax(-1)

    out = make_trainer(preprocess_logits_for_metrics=argmax).predict(ragged_dataset())
    full = make_trainer().predict(ragged_dataset())
    assert out.predictions.shape == (10, 6)
    mask = full.label_ids[:, :3] != -100
    np.testing.assert_array_equal(out.predictions[:, :3][mask], full.predictions[:, :3].argmax(-1)[mask])
    assert seen["labels"] == (2, 4)  # the last batch's local labels


def test_compute_metrics_failure_names_function_and_shapes():
    def broken_metric(eval_pred):
        raise KeyError("f1")

    trainer = make_trainer(eval_dataset=ragged_dataset(), compute_metrics=broken_metric)
    with pytest.raises(RuntimeError) as info:
        trainer.evaluate()
    message = str(info.value)
    assert "compute_metrics" in message and "broken_metric" in message
    assert "(10, 6, 5)" in message and "(10, 6)" in message and "f1" in message
    assert isinstance(info.value.__cause__, KeyError)


class Stream(IterableDataset):
    """An iterable dataset without __len__."""

    def __init__(self, items):
        self.items = items

    def __iter__(self):
        return iter(self.items)


def test_iterable_dataset_without_len_is_counted():
    data = ragged_dataset()
    trainer = make_trainer()
    output = trainer.evaluation_loop(trainer.get_test_dataloader(Stream(data)), "Prediction")
    assert output.num_samples == len(data)
    assert output.predictions.shape == (len(data), 6, CLASSES)
    reference = make_trainer().predict(data)
    np.testing.assert_array_equal(output.predictions, reference.predictions)


def test_empty_datasets_are_clear_errors():
    with pytest.raises(ValueError, match="empty"):
        make_trainer().predict([])
    with pytest.raises(ValueError, match="no batches"):
        make_trainer().predict(Stream([]))
    with pytest.raises(ValueError, match="eval_dataset"):
        make_trainer().evaluate()


@pytest.mark.slow  # over a second
def test_memory_metrics_in_evaluate_and_absent_when_skipped():
    data = ragged_dataset(1, BATCH)
    with_mem = make_trainer(eval_dataset=data, skip_memory_metrics=False).evaluate()
    assert {"eval_mem_cpu_alloc_delta", "eval_mem_cpu_peaked_delta", "init_mem_cpu_alloc_delta",
            "init_mem_cpu_peaked_delta"} <= set(with_mem)
    without = make_trainer(eval_dataset=data, skip_memory_metrics=True).evaluate()
    assert not any("_mem_" in key for key in without)


# ------------------------------------------------------------------------------------------------ gathering units


def test_pad_and_concatenate_any_rank_and_dtype():
    pieces = [np.ones((2, 1, 3), np.float32), np.zeros((1, 3, 2), np.float32), np.full((2, 2, 3), 7, np.float32)]
    out = pad_and_concatenate(list(pieces))
    assert out.shape == (5, 3, 3)
    np.testing.assert_array_equal(out[0], [[1, 1, 1], [-100, -100, -100], [-100, -100, -100]])
    np.testing.assert_array_equal(out[2], [[0, 0, -100], [0, 0, -100], [0, 0, -100]])
    np.testing.assert_array_equal(out[3:, :2], 7)
    assert pad_and_concatenate([np.array(1.0), np.array(2.0)]).tolist() == [1.0, 2.0]
    small = pad_and_concatenate([np.ones((1, 1), np.uint8), np.ones((1, 2), np.uint8)])
    assert small.dtype == np.int64 and small.tolist() == [[1, -100], [1, 1]]
    with pytest.raises(ValueError, match="rank"):
        pad_and_concatenate([np.ones((1, 2)), np.ones((1, 2, 2))])


def test_accumulator_structure_change_is_an_error():
    acc = OutputAccumulator()
    acc.add((torch.ones(2, 3),))
    acc.add((torch.ones(2, 3), torch.ones(2)))
    with pytest.raises(ValueError, match="structure"):
        acc.result()


def test_gather_across_ranks_is_identity_without_process_group():
    nested = {"a": (torch.ones(2, 3),)}
    assert gather_across_ranks(nested) is nested


def _gather_worker(rank: int, world_size: int, port: int, queue) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        length = 2 + rank  # rank 0: seq 2, rank 1: seq 3; rank 1 has one sample more
        local = {"x": torch.full((1 + rank, length), float(rank)), "s": torch.tensor(float(rank))}
        gathered = gather_across_ranks(local)
        # a sharded eval: 5 items, each global batch of 4 split in contiguous halves, the last item duplicated
        data = ragged_dataset(2, 1)
        shards = [[[0, 1], [4]], [[2, 3], [4]]][rank]
        trainer = make_fake_trainer()
        out = trainer.evaluation_loop(DataLoader(data, batch_sampler=shards), "Prediction")
        queue.put((rank, gathered["x"].numpy().tolist(), gathered["s"].numpy().tolist(),
                   out.predictions, out.label_ids, out.num_samples))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gather_across_ranks_two_processes_pads_sequence_dim():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_gather_worker, args=(rank, 2, port, queue)) for rank in range(2)]
    for proc in procs:
        proc.start()
    results = {item[0]: item[1:] for item in (queue.get(timeout=60) for _ in procs)}
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    expected = [[0.0, 0.0, -100.0], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
    for rank in range(2):
        x, s, preds, labels, num_samples = results[rank]
        assert (x, s) == (expected, [0.0, 1.0])
        # gathered in dataset order, the duplicated padding sample dropped, sequence dims padded across ranks
        reference = make_trainer().predict(ragged_dataset(2, 1))
        assert num_samples == 5
        np.testing.assert_allclose(preds, reference.predictions, atol=1e-6)
        np.testing.assert_array_equal(labels, reference.label_ids)


# ------------------------------------------------------------------------------------------------ integration


def test_eval_functions_rely_only_on_the_contract():
    data = ragged_dataset()
    fake = make_fake_trainer()
    assert isinstance(fake, EvalLoopTrainer)
    out = fake.predict(data)
    real = make_trainer().predict(data)
    assert_nested_equal(out.predictions, real.predictions)
    assert_nested_equal(out.label_ids, real.label_ids)
    assert out.metrics["test_loss"] == pytest.approx(real.metrics["test_loss"])
    assert [name for name, _ in fake.callback_handler.events][-1] == "on_predict"


def test_bf16_full_eval_predictions_are_float32():
    data = ragged_dataset(2, BATCH)
    out = make_trainer(bf16_full_eval=True).predict(data)
    reference = make_trainer().predict(data)
    assert out.predictions.dtype == np.float32
    np.testing.assert_allclose(out.predictions, reference.predictions, atol=0.05)


class MemoryModel(nn.Module):
    """Returns (logits, mems) and records the mems it was given (``past_index``)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, CLASSES)
        self.seen: list[bool] = []

    def forward(self, input_ids, mems=None):
        self.seen.append(mems is not None)
        logits = self.emb(input_ids)
        return logits, logits.detach() + 1


def test_past_index_feeds_mems_to_the_next_batch():
    data = [{"input_ids": torch.arange(3) + i} for i in range(8)]
    model = MemoryModel()
    trainer = make_trainer(model, past_index=2)
    out = trainer.predict(data)
    assert model.seen == [False, True]
    assert out.label_ids is None and out.predictions[0].shape == (8, 3, CLASSES)
    assert trainer._past is None


def test_evaluation_during_training_reaches_log_history():
    data = ragged_dataset(2, BATCH)
    trainer = make_trainer(eval_dataset=data, eval_strategy="steps", eval_steps=1, max_steps=2,
                           per_device_train_batch_size=BATCH, logging_steps=1, save_strategy="no")
    trainer.train_dataset = ragged_dataset(1, BATCH)  # one length: shuffled training batches still stack
    trainer.train()
    evals = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert [entry["step"] for entry in evals] == [1, 2]
    assert all(entry["epoch"] > 0 for entry in evals)
    assert [name for name, _ in trainer.recorder.events].count("on_evaluate") == 2


def test_no_batches_on_a_process_names_the_dropped_round_and_the_fix():
    """sentence-transformers sets dataloader_drop_last=True on several processes: 7 rows in batches of 4 on 2
    processes make no full round, so every process gets no batch; the error says so instead of 'empty dataset'."""
    pytest.importorskip("accelerate")
    from accelerate.data_loader import BatchSamplerShard

    from trainwell.loops.eval_loop import no_batches_message

    rows = list(range(7))
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(rows), batch_size=4, drop_last=True)
    shard = BatchSamplerShard(batches, num_processes=2, process_index=1, split_batches=False, even_batches=True)
    loader = torch.utils.data.DataLoader(rows, batch_sampler=shard)
    assert list(loader) == []
    message = no_batches_message(loader, "Evaluation")
    assert "7 rows in batches of 4" in message and "2 processes" in message
    assert "dataloader_drop_last=True" in message and "per_device_eval_batch_size" in message
    empty = torch.utils.data.DataLoader([], batch_size=4)
    assert "pass a non-empty dataset" in no_batches_message(empty, "Evaluation")
