"""A ``checkpoint_store`` that cannot be used fails ``train()`` at its start with one clear error naming the URL, the
argument, the cause and the fix, within its deadline (``TRAINWELL_STORE_TIMEOUT_S``), saying on stderr what it waits
for: a store that accepts connections and never answers, a port nothing listens on, a store that answers 403 to
everything. Each is a tiny server in this process (no moto: the missing bucket and the store that stops answering
mid-run are in ``test_object_store_s3.py``), reached through s3fs.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import RegressionModel, regression_data
from helpers.launch import free_port
from trainwell import Trainer, TrainingArguments
from trainwell.checkpoint import store_calls
from trainwell.checkpoint.lock import LOCK_NAME
from trainwell.checkpoint.store_calls import TIMEOUT_ENV, StoreAccessError, StoreTimeoutError

pytest.importorskip("s3fs")

URL = "s3://tw-bucket/run"


def _options(endpoint: str, **extra: object) -> dict:
    return {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}, "key": "testing",
            "secret": "testing-secret", **extra}


def _train(out: Path, options: dict) -> None:
    args = TrainingArguments(output_dir=str(out), max_steps=2, save_steps=1, per_device_train_batch_size=4,
                             report_to="none", use_cpu=True, disable_tqdm=True, checkpoint_store=URL,
                             storage_options=options)
    Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16)).train()


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint that accepts every connection and never sends a byte (a store that stopped answering)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in held:
        conn.close()


class _Forbidden(http.server.BaseHTTPRequestHandler):
    """S3's answer to a request whose credentials may not do it."""

    def _deny(self) -> None:
        body = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Access Denied'
                b'</Message><RequestId>1</RequestId></Error>')
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _deny

    def log_message(self, *args: object) -> None:
        pass


def test_a_silent_store_fails_the_start_within_its_deadline_naming_url_and_deadline(tmp_path, silent, monkeypatch,
                                                                                      capfd):
    """Before: 425 s without a word, then botocore's raw ReadTimeoutError. Now the deadline (1.5 s here) ends it with
    an error naming the URL, the endpoint, the deadline and its setting, after a progress line on stderr; the
    output_dir lock is released."""
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    monkeypatch.setattr(store_calls, "FIRST_REPORT_S", 0.3)
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError) as caught:
        _train(tmp_path / "out", _options(silent))
    took = time.monotonic() - start
    message = str(caught.value)
    assert took < 6, took
    assert f"checkpoint_store={URL!r}" in message and f"endpoint {silent}" in message
    assert "did not answer within 1.0 s while taking the store's lock" in message and TIMEOUT_ENV in message
    err = capfd.readouterr().err
    assert f"waiting for checkpoint_store {URL} (taking the store's lock)" in err and "giving up after 1.0 s" in err
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def test_a_refused_port_names_the_endpoint_and_what_to_check(tmp_path):
    """Nothing listens at the endpoint (botocore's retries cut to one try: its own back-off is ~13 s):
    before, botocore's raw EndpointConnectionError."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StoreAccessError) as caught:
        _train(tmp_path / "out", _options(endpoint, config_kwargs={"retries": {"max_attempts": 1}}))
    message = str(caught.value)
    assert f"checkpoint_store={URL!r} (endpoint {endpoint}) cannot be used: nothing answers" in message
    assert "EndpointConnectionError" in message and "endpoint_url" in message and "server is running" in message
    assert not (tmp_path / "out" / LOCK_NAME).exists()


def test_a_forbidden_store_names_the_credentials_to_check(tmp_path):
    """Every request answered 403 AccessDenied: before, a bare ``PermissionError: Forbidden``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forbidden)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(StoreAccessError) as caught:
            _train(tmp_path / "out", _options(f"http://127.0.0.1:{server.server_address[1]}"))
    finally:
        server.shutdown()
        server.server_close()
    message = str(caught.value)
    assert f"checkpoint_store={URL!r}" in message and "access was denied while taking the store's lock" in message
    assert "PermissionError" in message and "credentials" in message and "storage_options" in message
    assert "testing-secret" not in message
