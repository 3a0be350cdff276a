"""push_to_hub end to end: the real huggingface_hub client talks to a local hub endpoint started by the test.

The endpoint (127.0.0.1 only, chosen with ``HF_ENDPOINT``) implements what the client uses for small files:
``/api/repos/create``, ``/preupload/<rev>`` (every file "regular", so no LFS/xet upload) and ``/commit/<rev>``
(ndjson: a header line, then one line per file with its base64 content). It records every repository, commit and
file, so the tests check what the client really sent for each ``hub_strategy``.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest
import torch

from trainwell import Trainer, TrainingArguments

pytest.importorskip("huggingface_hub")

TOKEN = "hf_trainwell_test_token"


class Hub:
    """What the local endpoint received: repositories created and commits (message, revision, files)."""

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, Any]] = {}
        self.commits: list[dict[str, Any]] = []
        self.tokens: set[str] = set()
        self.unknown: list[str] = []
        self.validated: list[dict[str, Any]] = []
        self.commit_delay = 0.0  # seconds a commit takes: a push still running when the next save comes
        self.lock = threading.Lock()

    def files(self, revision: str = "main") -> dict[str, bytes]:
        """The repository's tree at ``revision`` after every commit."""
        tree: dict[str, bytes] = {}
        for commit in self.commits:
            if commit["revision"] == revision:
                tree.update(commit["files"])
        return tree

    def messages(self) -> list[str]:
        return [c["summary"] for c in self.commits]


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_POST(self) -> None:
            auth = self.headers.get("Authorization", "")
            body, path = self._body(), unquote(urlparse(self.path).path)
            endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
            with hub.lock:
                hub.tokens.add(auth.removeprefix("Bearer "))
                if path == "/api/repos/create":
                    payload = json.loads(body)
                    repo_id = f"{payload.get('organization') or 'tester'}/{payload['name']}"
                    hub.repos.setdefault(repo_id, payload)
                    return self._reply(200, {"url": f"{endpoint}/{repo_id}", "name": repo_id, "id": repo_id})
                if path == "/api/validate-yaml":  # the client checks a README.md's metadata before committing it
                    hub.validated.append(json.loads(body))
                    return self._reply(200, {"warnings": []})
                parts = path.split("/")  # /api/models/<ns>/<name>/<action>/<revision>
                if len(parts) >= 7 and parts[:3] == ["", "api", "models"]:
                    repo_id, action, revision = f"{parts[3]}/{parts[4]}", parts[5], "/".join(parts[6:])
                    if repo_id not in hub.repos:
                        return self._reply(404, {"error": f"Repository {repo_id} not found"})
                    if action == "preupload":
                        files = json.loads(body)["files"]
                        return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                            "shouldIgnore": False, "oid": None} for f in files]})
                    if action == "commit":
                        hub.lock.release()  # let other requests in while this commit "takes time"
                        try:
                            time.sleep(hub.commit_delay)
                        finally:
                            hub.lock.acquire()
                        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
                        header = next(entry["value"] for entry in lines if entry["key"] == "header")
                        files = {e["value"]["path"]: base64.b64decode(e["value"]["content"])
                                 for e in lines if e["key"] == "file"}
                        others = [e["key"] for e in lines if e["key"] not in ("header", "file")]
                        oid = f"{len(hub.commits) + 1:040x}"
                        hub.commits.append({"repo": repo_id, "revision": revision, "summary": header["summary"],
                                            "files": files, "others": others})
                        return self._reply(200, {"commitUrl": f"{endpoint}/{repo_id}/commit/{oid}",
                                                 "commitOid": oid, "pullRequestUrl": None})
                hub.unknown.append(f"POST {path}")
            self._reply(404, {"error": f"not implemented by the test hub: {path}"})

        def do_GET(self) -> None:
            with hub.lock:
                hub.unknown.append(f"GET {self.path}")
            self._reply(404, {"error": "not implemented by the test hub"})

    return Handler


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Any:
    state = Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield state
    server.shutdown()
    server.server_close()
    assert state.unknown == []  # the client used nothing the test endpoint does not implement


def make_trainer(tiny: Any, tmp_path: Path, **overrides: Any) -> Trainer:
    """Four optimizer steps on a tiny regression model, a checkpoint every two steps."""
    options: dict[str, Any] = dict(output_dir=str(tmp_path / "my-model"), push_to_hub=True, hub_token=TOKEN,
                                   max_steps=4, save_steps=2, logging_steps=1, per_device_train_batch_size=4,
                                   eval_strategy="steps", eval_steps=2, learning_rate=0.05, report_to="none",
                                   disable_tqdm=True, use_cpu=True, seed=0)
    options.update(overrides)
    return Trainer(model=tiny.RegressionModel(), args=TrainingArguments(**options),
                   train_dataset=tiny.regression_data(16), eval_dataset=tiny.regression_data(8, seed=1))


def _weights(tmp_path: Path, data: bytes) -> dict[str, Any]:
    from safetensors.torch import load

    return dict(load(data))


def test_end_strategy_pushes_once_with_a_model_card(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    trainer = make_trainer(tiny, tmp_path, hub_strategy="end", hub_private_repo=True)
    assert trainer.hub_model_id == "tester/my-model"
    assert hub.repos["tester/my-model"]["visibility"] == "private"
    trainer.train()
    assert hub.commits == []  # "end": nothing while training
    info = trainer.push_to_hub(commit_message="Final model")
    assert info.oid == f"{1:040x}" and hub.messages() == ["Final model"]
    files = hub.files()
    assert {"model.safetensors", "training_args.bin", "README.md"} <= set(files)
    assert not any(p.startswith(("checkpoint-", "_")) for p in files)  # checkpoints stay local
    pushed = _weights(tmp_path, files["model.safetensors"])
    final = trainer.model.state_dict()
    assert set(pushed) == set(final)
    for name, value in final.items():  # pytest.approx (9.x) refuses nested containers: compare tensor by tensor
        torch.testing.assert_close(pushed[name], value.cpu(), rtol=1e-6, atol=0)
    card = files["README.md"].decode()
    assert card.startswith("---\n") and "library_name: trainwell" in card and "model_name: my-model" in card
    assert "- learning_rate: 0.05" in card and "- training_steps: 4" in card and "- seed: 0" in card
    assert "## Training results" in card and "| 2 |" in card and "| 4 |" in card
    assert hub.tokens == {TOKEN}
    assert [v["content"] for v in hub.validated] == [card]  # the card's metadata went through validation


def test_every_save_pushes_each_checkpoint_in_the_background(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    trainer = make_trainer(tiny, tmp_path, hub_strategy="every_save", hub_always_push=True)
    trainer.train()  # waits for the running pushes at its end
    assert hub.messages() == ["Training in progress, step 2", "Training in progress, step 4"]
    # trainwell's own files (the output_dir lock, checkpoints being written, temporary copies) stay local
    assert sorted(hub.files()) == ["model.safetensors", "training_args.bin"]
    for commit in hub.commits:
        assert "model.safetensors" in commit["files"] and "training_args.bin" in commit["files"]
        assert not any(p.startswith("checkpoint-") for p in commit["files"])
    checkpoint = tmp_path / "my-model" / "checkpoint-4" / "model.safetensors"
    assert hub.files()["model.safetensors"] == checkpoint.read_bytes()


@pytest.mark.slow  # over a second
def test_a_save_during_a_running_push_is_skipped_unless_hub_always_push(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    hub.commit_delay = 2.0  # the step-2 push is still running when step 4 saves
    make_trainer(tiny, tmp_path, hub_strategy="every_save").train()
    assert hub.messages() == ["Training in progress, step 2"]
    hub.commits.clear()
    make_trainer(tiny, tmp_path / "again", hub_strategy="every_save", hub_always_push=True).train()
    assert hub.messages() == ["Training in progress, step 2", "Training in progress, step 4"]


def test_non_blocking_push_returns_a_future(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    trainer = make_trainer(tiny, tmp_path, hub_strategy="end", max_steps=1, eval_strategy="no")
    trainer.train()
    future = trainer.push_to_hub(blocking=False)
    assert future.result(timeout=120).oid == f"{1:040x}" and hub.messages() == ["End of training"]


def test_missing_huggingface_hub_is_named_at_construction(tiny: Any, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if not installed
    with pytest.raises(ImportError, match=r"push_to_hub needs huggingface_hub: pip install huggingface_hub"):
        make_trainer(tiny, tmp_path)


def test_checkpoint_strategy_pushes_last_checkpoint_folder(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    trainer = make_trainer(tiny, tmp_path, hub_strategy="checkpoint", hub_always_push=True)
    trainer.train()
    assert sorted(hub.messages()) == sorted(["Training in progress, step 2", "Training in progress, step 2, checkpoint",
                                             "Training in progress, step 4", "Training in progress, step 4, checkpoint"])
    files = hub.files()
    local = tmp_path / "my-model" / "checkpoint-4"
    assert files["last-checkpoint/model.safetensors"] == (local / "model.safetensors").read_bytes()
    assert json.loads(files["last-checkpoint/trainer_state.json"])["global_step"] == 4
    assert not any(p.startswith("checkpoint-") for p in files)


def test_all_checkpoints_strategy_pushes_each_checkpoint_by_name(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    trainer = make_trainer(tiny, tmp_path, hub_strategy="all_checkpoints", hub_always_push=True)
    trainer.train()
    files = hub.files()
    for step in (2, 4):
        assert json.loads(files[f"checkpoint-{step}/trainer_state.json"])["global_step"] == step
        assert f"checkpoint-{step}/model.safetensors" in files
    assert "last-checkpoint/model.safetensors" not in files and "model.safetensors" in files


def test_revision_and_explicit_model_id(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    hub.repos["org/exp"] = {"name": "exp"}  # exists already: reused (exist_ok)
    trainer = make_trainer(tiny, tmp_path, hub_strategy="end", hub_model_id="org/exp", hub_revision="dev")
    trainer.train()
    trainer.push_to_hub()
    assert [(c["repo"], c["revision"], c["summary"]) for c in hub.commits] == [("org/exp", "dev", "End of training")]


def test_save_model_pushes_and_set_push_to_hub(tiny: Any, tmp_path: Path, hub: Hub) -> None:
    args = TrainingArguments(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, max_steps=1,
                             save_strategy="no", disable_tqdm=True)
    assert args.set_push_to_hub("me/model", strategy="end", token=TOKEN) is args
    assert (args.push_to_hub, args.hub_model_id, args.hub_strategy.value, args.hub_token) == (
        True, "me/model", "end", TOKEN)
    trainer = Trainer(model=tiny.RegressionModel(), args=args, train_dataset=tiny.regression_data(8))
    trainer.train()
    trainer.save_model()  # as upstream: save_model pushes when push_to_hub is set
    assert hub.messages() == ["Model save"] and "model.safetensors" in hub.files()
    trainer.save_model(str(tmp_path / "elsewhere"))
    assert len(hub.commits) == 2


def test_same_arguments_as_upstream() -> None:
    transformers = pytest.importorskip("transformers")
    import inspect

    for ours, theirs in ((Trainer.push_to_hub, transformers.Trainer.push_to_hub),
                         (Trainer.create_model_card, transformers.Trainer.create_model_card),
                         (Trainer.init_hf_repo, transformers.Trainer.init_hf_repo)):
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters)
    ours = inspect.signature(TrainingArguments.set_push_to_hub).parameters
    theirs = inspect.signature(transformers.TrainingArguments.set_push_to_hub).parameters
    assert [(n, p.default) for n, p in ours.items()] == [(n, p.default) for n, p in theirs.items()]
