"""Shared tiny models, datasets and an arguments factory for the Trainer tests (all CPU, all milliseconds)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch
from torch import nn
from torch.nn import functional as F

torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Without ``--basetemp``, each run gets a base temp folder of its own (removed at its end): pytest's default
    ``pytest-of-<user>/pytest-<N>`` folders are pruned by any 3 newer runs, so concurrent runs (two checkouts, CI
    beside a developer) deleted each other's ``tmp_path`` mid-test."""
    import tempfile

    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="pytest-trainwell-")
        config.stash[_OWN_BASETEMP] = config.option.basetemp


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the base temp folder :func:`pytest_configure` made."""
    import shutil

    folder = config.stash.get(_OWN_BASETEMP, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


_OWN_BASETEMP = pytest.StashKey[str]()


@pytest.fixture(scope="session", autouse=True)
def _private_temp_folder(tmp_path_factory: pytest.TempPathFactory):
    """Every temporary file of the session, subprocesses included (torchrun's torchelastic_* log folders,
    DeepSpeed's and the libraries' own temp files), goes under pytest's base temp folder, which is removed at
    the end (tmp_path_retention_policy = "none" in pyproject.toml): the suite leaves nothing in the temp folder."""
    import os
    import tempfile

    folder = tmp_path_factory.mktemp("tmp")
    previous_env, previous_tempdir = os.environ.get("TMPDIR"), tempfile.tempdir
    previous_extensions = os.environ.get("TORCH_EXTENSIONS_DIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    # DeepSpeed's ops compiled by the tests (~50 MB) go there too, not into ~/.cache/torch_extensions.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(folder / "torch_extensions"))
    yield folder
    if previous_extensions is None:
        os.environ.pop("TORCH_EXTENSIONS_DIR", None)
    tempfile.tempdir = previous_tempdir
    if previous_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous_env


_WATCHED_SIGNALS = tuple(s for s in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGCHLD")
                         if hasattr(__import__("signal"), s))


@pytest.fixture(autouse=True)
def _signal_handlers_left_as_found():
    """A test leaves the process's signal handlers as it found them (Ray installs a SIGTERM handler that turns any
    later SIGTERM into ``SystemExit: 15`` of whatever test runs then). Handlers a test changed are put back and the
    test fails, naming them."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():  # pragma: no cover - pytest runs tests in main
        yield
        return
    before = {name: signal.getsignal(getattr(signal, name)) for name in _WATCHED_SIGNALS}
    yield
    changed = []
    for name, handler in before.items():
        number = getattr(signal, name)
        if signal.getsignal(number) is not handler:
            changed.append(name)
            signal.signal(number, handler)
    assert not changed, f"the test left its own handler for {changed} installed (restored now)"


@pytest.fixture(autouse=True)
def _library_log_levels_left_as_found():
    """The ``trainwell`` and ``transformers`` loggers' levels are put back after each test: a Trainer with a
    ``log_level`` sets them (as upstream sets transformers' verbosity), and ``log_level="passive"`` reads them."""
    import logging

    loggers = [logging.getLogger(name) for name in ("trainwell", "transformers")]
    before = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, before):
        logger.setLevel(level)


class RegressionModel(nn.Module):
    """``y = w.x + b`` with a mean squared error; returns ``{"loss", "logits"}`` (loss None without labels)."""

    def __init__(self, dim: int = 2) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        """Prediction and, with labels, the MSE loss."""
        pred = self.linear(x).squeeze(-1)
        loss = F.mse_loss(pred, labels) if labels is not None else None
        return {"loss": loss, "logits": pred}


class ClassifierModel(nn.Module):
    """A linear 3-class classifier shaped like a transformers model (``config.num_labels``, ``device``)."""

    def __init__(self, dim: int = 4, num_labels: int = 3) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_labels=num_labels)
        self.linear = nn.Linear(dim, num_labels)

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return self.linear.weight.device

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        """Logits and, with labels, the (unweighted) cross entropy."""
        logits = self.linear(features)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


class TokenLM(nn.Module):
    """Embedding + linear LM; the loss is a token mean over labels that are not -100.

    With ``num_items_in_batch`` (the tokens of the whole optimizer step) it returns sum / num_items_in_batch, as
    upstream models do, so gradient accumulation is exact.
    """

    def __init__(self, vocab: int = 11, dim: int = 6) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                num_items_in_batch: torch.Tensor | int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, logits)."""
        logits = self.head(self.embed(input_ids))
        flat = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100,
                               reduction="sum")
        denominator = num_items_in_batch if num_items_in_batch is not None else labels.ne(-100).sum()
        return flat / denominator, logits


class TokenLMNoKwargs(TokenLM):
    """The same LM whose forward does not take ``num_items_in_batch`` (a plain per-batch token mean)."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, logits)."""
        return super().forward(input_ids, labels)


class BlockStack(nn.Module):
    """An input layer, an ``nn.ModuleList`` of tanh blocks and an MSE head (for gradient checkpointing)."""

    def __init__(self, dim: int = 4, depth: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(2, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.Tanh()) for _ in range(depth))
        self.out = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        """MSE of the stack's prediction."""
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        pred = self.out(h).squeeze(-1)
        return {"loss": F.mse_loss(pred, labels), "logits": pred}


def regression_data(n: int = 64, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` items ``{"x": (2,), "labels": ()}`` of ``y = x0 - 2 x1 + 0.5`` plus a little noise."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = x @ torch.tensor([1.0, -2.0]) + 0.5 + 0.1 * torch.randn(n, generator=g)
    return [{"x": x[i], "labels": y[i]} for i in range(n)]


def classification_data(n: int = 48, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` items ``{"features": (4,), "labels": int}``; the class is the argmax of the first 3 features."""
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(n, 4, generator=g)
    labels = feats[:, :3].argmax(-1)
    return [{"features": feats[i], "labels": labels[i]} for i in range(n)]


def token_data(n: int = 64, seq: int = 6, vocab: int = 11, seed: int = 0,
               masked: bool = True) -> list[dict[str, torch.Tensor]]:
    """``n`` rows of ``input_ids``/``labels``; with ``masked``, row i has ``i % seq`` labels set to -100."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, seq), generator=g)
    labels = torch.randint(0, vocab, (n, seq), generator=g)
    if masked:
        for i in range(n):
            labels[i, : i % seq] = -100
    return [{"input_ids": ids[i], "labels": labels[i]} for i in range(n)]


@pytest.fixture
def tiny() -> SimpleNamespace:
    """The tiny models and dataset builders above, for tests to use without importing conftest."""
    return SimpleNamespace(
        RegressionModel=RegressionModel, ClassifierModel=ClassifierModel, TokenLM=TokenLM,
        TokenLMNoKwargs=TokenLMNoKwargs, BlockStack=BlockStack, regression_data=regression_data,
        classification_data=classification_data, token_data=token_data,
    )


@pytest.fixture
def make_args(tmp_path: Any) -> Callable[..., Any]:
    """``make_args(**overrides)``: quiet TrainingArguments writing under ``tmp_path`` (no saving by default)."""
    from trainwell import TrainingArguments

    def build(**overrides: Any) -> Any:
        options: dict[str, Any] = dict(output_dir=str(tmp_path / "out"), report_to="none", disable_tqdm=True,
                                       save_strategy="no", per_device_train_batch_size=8,
                                       per_device_eval_batch_size=8, learning_rate=0.05, seed=0,
                                       dataloader_pin_memory=False)
        options.update(overrides)
        return TrainingArguments(**options)

    return build
