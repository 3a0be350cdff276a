"""The store's calls on the training thread: each within a deadline, saying so while it waits, and every failure
as one clear error naming the URL, the argument (``checkpoint_store``), the cause and the fix.

A store that stops answering (it accepts connections and never replies) would otherwise hold a request for as long
as the client's own timeouts times its retries (botocore's 60 s read timeout, retried by botocore and again by
s3fs: minutes at the start, over a quarter of an hour at the end of ``train()``), silently, and then raise the
client's raw error. Here:

1. every call (:func:`call`) runs in a daemon thread; the training thread waits at most :func:`deadline_s` seconds
   (``TRAINWELL_STORE_TIMEOUT_S``, default ``CALL_DEADLINE_S``) plus a second per ``MIN_RATE`` bytes it moves;
2. a wait longer than ``FIRST_REPORT_S`` prints a line on stderr saying what it waits for, for how long so far and
   when it gives up, then every ``EVERY_REPORT_S`` (as the rendezvous watch of :mod:`trainwell.runtime.distributed`);
3. past the deadline, :class:`StoreTimeoutError` names the URL and the deadline (the request is left to its daemon
   thread: a request that never returns cannot be cancelled);
4. a failure is raised as :class:`StoreAccessError` saying what it means (a missing bucket, access denied, an
   endpoint nothing answers at) and what to check; trainwell's own errors (:class:`CheckpointError`, the lock's
   :class:`~.lock.OutputDirLockedError`) pass unchanged.

``TRAINWELL_STORE_TIMEOUT_S`` also sets the background upload's deadline (:mod:`.store_upload`), so one setting
bounds every wait for the store. This module imports neither torch nor fsspec.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from .layout import CheckpointError
from .lock import OutputDirLockedError

T = TypeVar("T")

TIMEOUT_ENV = "TRAINWELL_STORE_TIMEOUT_S"
CALL_DEADLINE_S = 120.0  # one call on the training thread (a lock, a listing, a marker) without an answer: gone
MIN_RATE = 5e6  # a download may take a second more per this many bytes (as an upload, see store_upload)
FIRST_REPORT_S = 5.0  # a wait says what it waits for after this long,
EVERY_REPORT_S = 30.0  # then this often
RELEASE_S = 10.0  # the lock's release at the end is best effort: its lease stops, so it goes stale by itself


class StoreAccessError(CheckpointError):
    """``checkpoint_store`` could not be used: the message names the URL, the cause and what to check."""


class StoreTimeoutError(StoreAccessError):
    """The store did not answer within its deadline (``TRAINWELL_STORE_TIMEOUT_S``)."""


def configured_s() -> float | None:
    """``TRAINWELL_STORE_TIMEOUT_S`` in seconds, or None when unset; a value that is not a positive number raises."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds (how long trainwell waits "
                         "for checkpoint_store to answer before it raises)")
    return value


def deadline_s() -> float:
    """How long one call on the training thread may wait for the store (``TRAINWELL_STORE_TIMEOUT_S``)."""
    configured = configured_s()
    return CALL_DEADLINE_S if configured is None else configured


def seconds(value: float) -> str:
    """``value`` seconds as the messages show them: whole seconds, tenths below ten."""
    return f"{value:.0f} s" if value >= 10 else f"{value:.1f} s"


def endpoint_of(options: dict[str, Any]) -> str | None:
    """The endpoint a store's ``storage_options`` name (``endpoint_url``, also inside ``client_kwargs``), without
    any user or password it may carry (the options are secret; the endpoint is not)."""
    found = options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
    if not isinstance(found, str) or not found:
        return None
    parts = urlsplit(found)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else found


class WaitReport:
    """Prints, on stderr, what the training thread waits for once it has waited ``FIRST_REPORT_S``, then every
    ``EVERY_REPORT_S``; :meth:`due` is cheap and is called by the waiting loop."""

    def __init__(self, url: str, what: str, limit_s: float) -> None:
        self.url, self.what, self.limit_s = url, what, limit_s
        self.start = time.monotonic()
        self._next = self.start + FIRST_REPORT_S

    def waited(self) -> float:
        return time.monotonic() - self.start

    def until_next(self) -> float:
        """Seconds until the next line is due (at least a little: the loop's wait)."""
        return max(0.05, self._next - time.monotonic())

    def due(self) -> None:
        """Print the line when it is due."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + EVERY_REPORT_S
        print(f"trainwell: waiting for checkpoint_store {self.url} ({self.what}): {now - self.start:.0f} s so far, "
              f"giving up after {seconds(self.limit_s)} ({TIMEOUT_ENV}). Is the store reachable and answering?",
              file=sys.stderr, flush=True)


def call(url: str, what: str, fn: Callable[..., T], *args: Any, limit_s: float | None = None, moves: int = 0,
         endpoint: str | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, a call to the store at ``url`` (``what`` it does, for the messages), within
    ``limit_s`` (default :func:`deadline_s`) plus a second per ``MIN_RATE`` of the ``moves`` bytes it transfers;
    see the module docstring. ``endpoint``: named in the errors (:func:`endpoint_of`)."""
    limit = (deadline_s() if limit_s is None else limit_s) + moves / MIN_RATE
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: B036 - handed to the waiting thread as it is
            outcome["error"] = err
        finally:
            done.set()

    threading.Thread(target=run, name="trainwell-store-call", daemon=True).start()
    report = WaitReport(url, what, limit)
    while not done.wait(min(report.until_next(), max(0.0, limit - report.waited()))):
        if report.waited() >= limit:
            raise StoreTimeoutError(timeout_message(url, what, limit, endpoint))
        report.due()
    if "error" in outcome:
        raise access_error(outcome["error"], url, what, endpoint) from outcome["error"]
    return outcome["value"]


def best_effort(url: str, what: str, fn: Callable[..., object], *args: Any, endpoint: str | None = None,
                log: Callable[..., object] | None = None) -> bool:
    """:func:`call` within ``min(deadline_s(), RELEASE_S)``, a failure only logged (``log(fmt, *args)``); True when
    it succeeded. For what the run may leave undone (the lock's release: without its lease it goes stale)."""
    try:
        call(url, what, fn, *args, limit_s=min(deadline_s(), RELEASE_S), endpoint=endpoint)
    except Exception as err:
        if log is not None:
            log("%s", err)
        return False
    return True


def timeout_message(url: str, what: str, limit_s: float, endpoint: str | None = None) -> str:
    """The words of :class:`StoreTimeoutError`."""
    at = f" (endpoint {endpoint})" if endpoint else ""
    return (f"checkpoint_store={url!r}{at} did not answer within {seconds(limit_s)} while {what}: the store accepts "
            "no requests or answers none (an endpoint that stopped answering, a proxy or firewall that holds "
            "connections, a wrong endpoint). Check that the store is reachable from this machine and answering; "
            f"to wait longer, set {TIMEOUT_ENV} (seconds; the default is {CALL_DEADLINE_S:.0f}).")


_CONNECTION_ERRORS = ("EndpointConnectionError", "ConnectionError", "ConnectError", "ClientConnectorError",
                      "ConnectionRefusedError", "NewConnectionError", "gaierror", "ClientOSError")
_TIMEOUT_ERRORS = ("ReadTimeoutError", "ConnectTimeoutError", "FSTimeoutError", "TimeoutError", "timeout",
                   "ServerTimeoutError")


def _names(err: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(err).__mro__}


def access_error(err: BaseException, url: str, what: str, endpoint: str | None = None) -> BaseException:
    """``err`` (raised by the store's client while ``what``) as the error to raise: trainwell's own errors and
    interrupts as they are, anything else as a :class:`StoreAccessError` saying what it means and what to check."""
    if isinstance(err, (CheckpointError, OutputDirLockedError)) or not isinstance(err, Exception):
        return err
    at = f" (endpoint {endpoint})" if endpoint else ""
    names = _names(err)
    if isinstance(err, FileNotFoundError):
        cause, fix = ("the bucket (or container) does not exist", "create it, or correct the bucket's name in the "
                      "URL")
    elif isinstance(err, PermissionError):
        cause, fix = ("access was denied", "check the credentials (storage_options, the environment's "
                      "AWS_*/GOOGLE_*/AZURE_* variables, ~/.aws) and that they may list, read, write and delete "
                      "under this prefix")
    elif names & set(_CONNECTION_ERRORS):
        cause, fix = ("nothing answers at the store's endpoint (connection refused or unreachable)",
                      "check the endpoint (endpoint_url in storage_options' client_kwargs, AWS_ENDPOINT_URL), that "
                      "the server is running and that this machine can reach it")
    elif names & set(_TIMEOUT_ERRORS):
        cause, fix = ("the store did not answer in time", "check that the store is reachable and answering")
    else:
        cause, fix = "the store refused or failed the request", "check the URL, the credentials and the network"
    return StoreAccessError(f"checkpoint_store={url!r}{at} cannot be used: {cause} while {what} "
                            f"({type(err).__name__}: {err}). Fix: {fix}; or train without checkpoint_store.")


__all__ = ["CALL_DEADLINE_S", "StoreAccessError", "StoreTimeoutError", "TIMEOUT_ENV", "WaitReport", "access_error",
           "best_effort", "call", "configured_s", "deadline_s", "endpoint_of", "seconds"]
