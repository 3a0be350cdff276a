"""The session's fixtures: a private temp folder, signal handlers and log levels left as found, the tiny models and
datasets of :mod:`helpers` as the ``tiny`` fixture, and an arguments factory (all CPU, all milliseconds)."""

from __future__ import annotations

import gc
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

from helpers import (BlockStack, ClassifierModel, RegressionModel, TokenLM, TokenLMNoKwargs, classification_data,
                     regression_data, token_data)

torch.set_num_threads(1)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--all``: run every test, the slow ones too (what CI runs); without it and without ``-m``, a plain
    ``python -m pytest`` is the fast tier (no test that starts a process or takes over a second)."""
    parser.addoption("--all", action="store_true", default=False,
                     help="run every test, the slow ones (that start processes or take over a second) included, "
                          "as CI does")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The fast tier by default: without ``--all`` and without a ``-m`` expression, tests marked ``slow`` are
    deselected (a test named on the command line by its node id still runs)."""
    _build_deepspeed_ops_first(items)
    if config.getoption("--all") or config.option.markexpr:
        _heaviest_files_first(items)
        return
    named = {arg.split("::", 1)[0] for arg in config.args if "::" in arg}
    slow = [item for item in items if item.get_closest_marker("slow") is not None
            and item.nodeid.split("::", 1)[0] not in named]
    if slow:
        config.hook.pytest_deselected(items=slow)
        kept = set(map(id, items)) - set(map(id, slow))
        items[:] = [item for item in items if id(item) in kept]


#: The test files that took longest in the last full profile (``--all -n 2 --durations=0``, summed per file,
#: heaviest first; 2026-11-29). Under pytest-xdist they are handed out first, so that no long file starts last and
#: leaves the other workers idle at the end of the run. Order only: a renamed or removed file is simply not found.
HEAVIEST_FILES = (
    "tests/ecosystem/test_trl_scripts.py", "tests/test_installed_package.py", "tests/distributed/test_kill_resume.py",
    "tests/ecosystem/test_matrix.py", "tests/ecosystem/test_library_loaders_ranks.py",
    "tests/ecosystem/test_matrix_ranks.py",
    "tests/compat/examples/test_examples_5x.py", "tests/distributed/test_async_save_ranks.py",
    "tests/compat/test_seed_parity.py", "tests/compat/test_loop_compat.py", "tests/distributed/test_elastic_resume.py",
    "tests/checkpoint/test_checkpoint_tamper.py", "tests/distributed/test_ray_train.py",
    "tests/compat/examples/test_examples_v4.py", "tests/ecosystem/test_trl.py", "tests/compat/test_accelerate_launch.py",
    "tests/distributed/test_multi_node.py", "tests/tf/test_tf_trainer.py", "tests/ecosystem/test_ecosystem_resume.py",
    "tests/test_overhead_guard.py", "tests/ecosystem/test_sentence_transformers.py", "tests/ecosystem/test_patch.py",
    "tests/compat/test_public_names_compat.py", "tests/callbacks/test_trackers.py", "tests/test_readme_blocks.py",
)


def _heaviest_files_first(items: list[pytest.Item]) -> None:
    """Put the tests of :data:`HEAVIEST_FILES` first, in that order (the rest keep theirs). pytest-xdist's own
    reordering of files by their number of tests is turned off in :func:`pytest_configure`: it sent the long files
    with few tests (a pip install in a fresh venv, two-rank kill-and-resume jobs) to the end of the run."""
    rank = {name: i for i, name in enumerate(HEAVIEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def _build_deepspeed_ops_first(items: list[pytest.Item]) -> None:
    """Tests marked ``deepspeed`` launch DeepSpeed jobs: the first of them on each worker builds DeepSpeed's CPU op
    beforehand (fixture ``deepspeed_ops_built``), under the build's own limit rather than the job's."""
    for item in items:
        if item.get_closest_marker("deepspeed") is not None and "deepspeed_ops_built" not in item.fixturenames:
            item.fixturenames.insert(0, "deepspeed_ops_built")  # type: ignore[attr-defined]
            timeout = item.get_closest_marker("timeout")
            limit = timeout.args[0] if timeout is not None and timeout.args else 900
            item.add_marker(pytest.mark.timeout(limit + 1500))


@pytest.fixture(scope="session")
def deepspeed_ops_built() -> None:
    """DeepSpeed's ``cpu_adam`` op compiled into this session's ``TORCH_EXTENSIONS_DIR`` (see helpers.deepspeed_ops)."""
    pytest.importorskip("deepspeed")
    from helpers.deepspeed_ops import build_cpu_adam

    build_cpu_adam()


def pytest_report_header(config: pytest.Config) -> str | None:
    if config.getoption("--all") or config.option.markexpr:
        return None
    return "fast tier: tests marked slow are deselected (run everything with --all, as .ci/run does)"


FAST_TIER_LIMIT_S = 2.0  # a test not marked slow that takes longer is named at the end of the run
_over_limit: list[tuple[float, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the fast tier fast as the suite grows: note each test not marked ``slow`` whose setup or call took over
    :data:`FAST_TIER_LIMIT_S` (read on the controller under pytest-xdist too; reported, never failed: timings are
    not assertions)."""
    if report.when in ("setup", "call") and report.duration > FAST_TIER_LIMIT_S and "slow" not in report.keywords:
        _over_limit.append((report.duration, f"{report.nodeid} ({report.when})"))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if _over_limit and not (config.getoption("--all") or config.option.markexpr):
        terminalreporter.section(f"fast-tier tests over {FAST_TIER_LIMIT_S:.0f} s (mark them @pytest.mark.slow)")
        for duration, name in sorted(_over_limit, reverse=True):
            terminalreporter.write_line(f"{duration:6.2f} s  {name}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Without ``--basetemp``, each run gets a base temp folder of its own (removed at its end): pytest's default
    ``pytest-of-<user>/pytest-<N>`` folders are pruned by any 3 newer runs, so concurrent runs (two checkouts, CI
    beside a developer) deleted each other's ``tmp_path`` mid-test."""
    if config.getoption("--all"):
        if getattr(config.option, "durations", None) is None:
            config.option.durations = 25  # a full run ends with its 25 slowest tests
        if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order of _heaviest_files_first
            config.option.loadscopereorder = False
    import tempfile

    if config.option.basetemp is None:
        config.option.basetemp = tempfile.mkdtemp(prefix="pytest-trainwell-")
        config.stash[_OWN_BASETEMP] = config.option.basetemp
        # DeepSpeed's ops compiled by the tests (~50 MB, minutes of CPU on the first build) go under the base temp
        # folder, one build shared by every pytest-xdist worker (which inherit this process's environment; torch's
        # build lock makes a second worker wait for the first build instead of compiling again).
        import os

        config.stash[_EXTENSIONS_BEFORE] = os.environ.get("TORCH_EXTENSIONS_DIR")
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(config.option.basetemp) / "torch_extensions"))
    config.stash[_HOME_BEFORE] = _private_home(Path(config.option.basetemp) / "home")


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put back the home variables and remove the base temp folder :func:`pytest_configure` made."""
    import os
    import shutil

    for name, value in config.stash.get(_HOME_BEFORE, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    folder = config.stash.get(_OWN_BASETEMP, None)
    if folder is not None:
        if config.stash.get(_EXTENSIONS_BEFORE, None) is None:
            os.environ.pop("TORCH_EXTENSIONS_DIR", None)
        shutil.rmtree(folder, ignore_errors=True)


_OWN_BASETEMP = pytest.StashKey[str]()
_HOME_BEFORE = pytest.StashKey[dict]()
_EXTENSIONS_BEFORE = pytest.StashKey["str | None"]()
#: Variables that name a home or cache folder the libraries under test write into (HF datasets' and hub's caches,
#: wandb's and xet's logs, ~/.ray/auth_token, ~/.keras/keras.json, matplotlib's font cache...). All point under the
#: session's base temp folder, set before collection imports those libraries (several read them at import).
_HOME_VARIABLES = ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "HF_HOME", "HF_DATASETS_CACHE",
                   "WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "KERAS_HOME", "MPLCONFIGDIR",
                   "TRITON_CACHE_DIR", "PIP_CACHE_DIR")


def _private_home(home: Path) -> dict[str, str | None]:
    """Point every home and cache variable of :data:`_HOME_VARIABLES` under ``home``; returns the values before."""
    import os

    before = {name: os.environ.get(name) for name in _HOME_VARIABLES}
    home.mkdir(parents=True, exist_ok=True)
    os.environ["HOME"] = str(home)
    for name in _HOME_VARIABLES[1:]:
        os.environ[name] = str(home / name.lower())
    return before


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


_LOG_LEVELS_AT_START = {name: __import__("logging").getLogger(name).level for name in ("trainwell", "transformers")}


@pytest.fixture(autouse=True)
def _library_log_levels_left_as_found():
    """Each test starts and ends with the ``trainwell`` and ``transformers`` loggers at the levels the session
    started with: a Trainer with a ``log_level`` sets them (as upstream sets transformers' verbosity), a test module
    may silence transformers when it is imported, and ``log_level="passive"`` reads them."""
    import logging

    def reset() -> None:
        for name, level in _LOG_LEVELS_AT_START.items():
            logging.getLogger(name).setLevel(level)

    reset()
    yield
    reset()


@pytest.fixture
def tiny() -> SimpleNamespace:
    """The tiny models and dataset builders of :mod:`helpers`, for tests to use without importing them."""
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


@pytest.fixture(scope="module", autouse=True)
def _earlier_objects_out_of_gc_passes() -> None:
    """Before each test module, what earlier modules left alive (torch, transformers, TRL... imported once per
    worker: millions of objects) is moved out of the cyclic collector's reach (``gc.freeze``, after one collection).
    Every ``gc.collect()`` a test triggers (the memory tracker's, accelerate's batch-size finder, upstream's
    Trainer) then walks only the objects made since, instead of the whole heap: in a long session each took seconds.
    Reference counting still frees frozen objects; only cycles among them are left uncollected."""
    if os.environ.get("TRAINWELL_TEST_NO_GC_FREEZE"):
        return
    gc.collect()
    gc.freeze()
