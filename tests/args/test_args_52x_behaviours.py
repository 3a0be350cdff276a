"""Behaviours of the 5.2x releases in the arguments, each compared with the installed transformers where it is there:
``include_num_input_tokens_seen`` as "all"/"non_padding"/"no", ``torch_empty_cache_steps``'s check, a ``dtype`` written
to JSON as its name, and ``report_to`` picking up Kubeflow inside a TrainJob (with the progress reports it sends)."""

from __future__ import annotations

import dataclasses
import http.server
import json
import threading

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from trainwell import Trainer, TrainingArguments

try:
    import transformers
except ImportError:  # the oracle is optional: trainwell's side is checked alone
    transformers = None


def _both(tmp_path, **kwargs):
    ours = TrainingArguments(str(tmp_path / "tw"), report_to="none", **kwargs)
    if transformers is None:
        return ours, None
    return ours, transformers.TrainingArguments(str(tmp_path / "up"), report_to="none", use_cpu=True, **kwargs)


@pytest.mark.parametrize("given, held", [(True, "all"), (False, "no"), ("all", "all"), ("non_padding", "non_padding"),
                                         ("no", "no")])
def test_include_num_input_tokens_seen_values(tmp_path, given, held):
    ours, theirs = _both(tmp_path, include_num_input_tokens_seen=given)
    assert ours.include_num_input_tokens_seen == held
    if theirs is not None:
        assert theirs.include_num_input_tokens_seen == held


def test_include_num_input_tokens_seen_refuses_other_values(tmp_path):
    with pytest.raises(ValueError, match="include_num_input_tokens_seen='some' is not valid"):
        TrainingArguments(str(tmp_path), include_num_input_tokens_seen="some")


class MaskedLM(nn.Module):
    """A tiny LM whose forward takes the attention mask (so the collated batches keep it)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(7, 4), nn.Linear(4, 7)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids))
        return {"loss": F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100), "logits": logits}


def _padded_rows() -> list[dict[str, torch.Tensor]]:
    rows = []
    for i in range(8):
        real = 2 + i % 4  # 2..5 real tokens of 6
        mask = torch.tensor([1] * real + [0] * (6 - real))
        ids = torch.arange(6) % 7 * mask
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask.bool(), ids, -100)})
    return rows


@pytest.mark.slow  # over a second
@pytest.mark.parametrize("mode", ["all", "non_padding", "no"])
def test_tokens_seen_count_as_upstream(tmp_path, mode):
    """'non_padding' counts the attention mask's ones, 'all' every input id; the logged count as upstream's."""
    rows = _padded_rows()
    expected = {"all": 8 * 6, "non_padding": sum(int(r["attention_mask"].sum()) for r in rows), "no": 0}[mode]
    kwargs = dict(per_device_train_batch_size=4, max_steps=2, include_num_input_tokens_seen=mode, logging_steps=1)
    ours, theirs = _both(tmp_path, **kwargs)
    trainer = Trainer(model=MaskedLM(), args=ours, train_dataset=rows)
    trainer.train()
    assert trainer.state.num_input_tokens_seen == expected
    logged = [e["num_input_tokens_seen"] for e in trainer.state.log_history if "num_input_tokens_seen" in e]
    assert (logged[-1] == expected) if mode != "no" else logged == []
    if theirs is not None:
        upstream = transformers.Trainer(model=MaskedLM(), args=theirs, train_dataset=rows)
        upstream.train()
        assert upstream.state.num_input_tokens_seen == expected
        assert logged == [e["num_input_tokens_seen"] for e in upstream.state.log_history
                          if "num_input_tokens_seen" in e]


@pytest.mark.parametrize("value", [0, -1, 2.0, 1.5])
def test_torch_empty_cache_steps_is_checked_as_upstream(tmp_path, value):
    with pytest.raises(ValueError, match="torch_empty_cache_steps must be a positive integer"):
        TrainingArguments(str(tmp_path), torch_empty_cache_steps=value)
    if transformers is not None:
        with pytest.raises(ValueError, match="torch_empty_cache_steps` must be an integer bigger than 0"):
            transformers.TrainingArguments(str(tmp_path), torch_empty_cache_steps=value)


def test_torch_empty_cache_steps_refuses_a_bool(tmp_path):
    """Upstream takes True for 1 (a bool is an int); trainwell refuses it, as it refuses a bool for every int field."""
    with pytest.raises(ValueError, match="torch_empty_cache_steps must be a positive integer"):
        TrainingArguments(str(tmp_path), torch_empty_cache_steps=True)


def test_torch_empty_cache_steps_accepts_a_count_and_command_line_text(tmp_path):
    assert TrainingArguments(str(tmp_path), torch_empty_cache_steps=3).torch_empty_cache_steps == 3
    assert TrainingArguments(str(tmp_path), torch_empty_cache_steps="4").torch_empty_cache_steps == 4


def _with_model_init_kwargs(base: type) -> type:
    """A config that adds a dict field, as TRL's do (``model_init_kwargs={"dtype": torch.bfloat16}``)."""
    return dataclasses.make_dataclass("Config", [("model_init_kwargs", dict, dataclasses.field(default=None))],
                                      bases=(base,))


def test_a_dtype_is_written_to_json_as_its_name(tmp_path):
    kwargs = {"dtype": torch.bfloat16, "nested": {"dtype": torch.float16}, "other": 1}
    ours = _with_model_init_kwargs(TrainingArguments)(str(tmp_path), model_init_kwargs=dict(kwargs))
    written = json.loads(ours.to_json_string())["model_init_kwargs"]
    assert written == {"dtype": "bfloat16", "nested": {"dtype": "float16"}, "other": 1}
    assert ours.to_dict()["model_init_kwargs"] == written
    if transformers is not None:
        theirs = _with_model_init_kwargs(transformers.TrainingArguments)(str(tmp_path), model_init_kwargs=dict(kwargs))
        assert json.loads(theirs.to_json_string())["model_init_kwargs"] == written


@pytest.mark.parametrize("disabled", [False, True])
@pytest.mark.parametrize("report_to", ["none", "tensorboard"])
def test_report_to_picks_up_kubeflow_inside_a_trainjob(tmp_path, monkeypatch, disabled, report_to):
    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://127.0.0.1:1/status")
    if disabled:
        monkeypatch.setenv("DISABLE_KUBEFLOW_INTEGRATION", "true")
    expected = ([] if report_to == "none" else [report_to]) + ([] if disabled else ["kubeflow"])
    assert TrainingArguments(str(tmp_path), report_to=report_to).report_to == expected
    if transformers is not None:
        assert transformers.TrainingArguments(str(tmp_path), report_to=report_to).report_to == expected


def test_no_kubeflow_outside_a_trainjob(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL", raising=False)
    assert TrainingArguments(str(tmp_path)).report_to == []


class _StatusServer(http.server.BaseHTTPRequestHandler):
    received: list[tuple[str, dict]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).received.append((self.headers["Authorization"], body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_kubeflow_progress_reaches_the_trainjob(tmp_path, monkeypatch):
    """Training inside a (local stand-in) TrainJob: the status endpoint gets 0% with the planned steps, then 100% with
    the last logged loss, each with the service-account token."""
    server = http.server.HTTPServer(("127.0.0.1", 0), _StatusServer)
    _StatusServer.received = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        token = tmp_path / "token"
        token.write_text("secret\n")
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", f"http://127.0.0.1:{server.server_port}/status")
        monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_TOKEN", str(token))
        monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_CA_CERT", raising=False)
        args = TrainingArguments(str(tmp_path / "out"), per_device_train_batch_size=4, max_steps=2, logging_steps=1,
                                 save_strategy="no", disable_tqdm=True)
        assert args.report_to == ["kubeflow"]
        Trainer(model=MaskedLM(), args=args, train_dataset=_padded_rows()).train()
    finally:
        server.shutdown()
        thread.join()
    statuses = [body["trainerStatus"] for _, body in _StatusServer.received]
    assert {auth for auth, _ in _StatusServer.received} == {"Bearer secret"}
    assert statuses[0]["progressPercentage"] == 0
    assert statuses[0]["metrics"] == [{"name": "total_steps", "value": "2"}]
    assert statuses[-1]["progressPercentage"] == 100 and statuses[-1]["estimatedRemainingSeconds"] == 0
    assert "loss" in {m["name"] for m in statuses[-1]["metrics"]}
