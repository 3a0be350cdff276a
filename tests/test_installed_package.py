"""What a user installs is what is tested: the wheel in a fresh virtual environment, each console script through its
installed executable, and the README's first block as written.

The rest of the suite imports trainwell from the checkout and runs ``python -m trainwell``; a packaging mistake (a
console script that points at a module, a package left out of the wheel, a test folder shipped in it) shows only
here.

* The wheel is built once per session (``pip wheel --no-deps``) and installed without dependencies into a new virtual
  environment that reads the suite's own packages (torch, matplotlib...) through a ``.pth`` line, so it takes seconds;
  trainwell itself is only the wheel's copy there (the checkout's editable install is not on that path).
* The README's first block runs in a copy of the checkout, in a virtual environment with nothing installed, exactly as
  written: it installs torch and the project itself. Only the recipe's step count is lowered, by the
  ``TRAINWELL_RECIPE_MAX_STEPS`` variable the built-in recipe honours.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
#: Steps of the built-in recipe in these tests (the recipe's own 800 would take minutes on a busy CI machine).
QUICK_STEPS = "12"


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (f"{' '.join(map(str, cmd))} exited with {result.returncode}\n"
                                    f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}")
    return result


def _clean_env(tmp: Path, venv: Path) -> dict[str, str]:
    """The environment of a user's shell with ``venv`` activated: no PYTHONPATH, no trainwell variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "TRAINWELL_", "PIP_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               OMP_NUM_THREADS="1", PIP_CACHE_DIR=str(tmp / "pip-cache"), PIP_DISABLE_PIP_VERSION_CHECK="1",
               MPLBACKEND="Agg")
    return env


def _checkout_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked and untracked, not ignored): what a clone would hold."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-co", "--exclude-standard", "-z"],
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")  # a source tree without .git: no clone to copy
    for name in filter(None, listed.stdout.split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv, wheel): the wheel built from a copy of the checkout, installed alone into a fresh virtual environment."""
    tmp = tmp_path_factory.mktemp("installed")
    source = _checkout_copy(tmp / "src")
    env = _clean_env(tmp, Path(sys.prefix))
    # build isolation would fetch setuptools from the index; the suite's own is used when it has one
    isolation = ["--no-build-isolation"] if _has_setuptools() else []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(tmp / "dist"), str(source)],
         cwd=tmp, env=env)
    wheel = next((tmp / "dist").glob("trainwell-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp, env=env)
    site = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp, env=env).stdout.strip())
    # The suite's packages, appended after the venv's own site-packages (a plain path line: the checkout's editable
    # install, a .pth in that folder, is not processed from here, so `trainwell` can only be the wheel's copy).
    (site / "suite-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
         cwd=tmp, env=_clean_env(tmp, venv))
    return venv, wheel


def _has_setuptools() -> bool:
    try:
        import setuptools  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_wheel_holds_the_package_and_nothing_else(installed):
    _, wheel = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"trainwell", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    assert "trainwell/__init__.py" in names and "trainwell/cli/main.py" in names
    assert "trainwell/cli/recipes/charlm.py" in names
    assert not [n for n in names if "/tests/" in n or n.startswith(("tests/", "docs/", "bench/", "examples/"))]
    assert not [n for n in names if n.endswith((".pyc", ".egg-info"))]
    # every package and subpackage of the checkout is in the wheel
    packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "trainwell").rglob("__init__.py")}
    assert packages <= {os.path.dirname(n) for n in names}, packages - {os.path.dirname(n) for n in names}


def test_every_console_script_starts_from_its_installed_executable(installed, tmp_path):
    venv, _ = installed
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    env = _clean_env(tmp_path, venv)
    for name in scripts:
        executable = venv / "bin" / name
        assert executable.is_file(), f"{name} was not installed into {venv / 'bin'}"
        result = _run([str(executable), "--help"], cwd=tmp_path, env=env)
        assert "usage:" in result.stdout and name in result.stdout


def test_the_installed_command_trains_plots_generates_and_reports(installed, tmp_path):
    venv, _ = installed
    trainwell = str(venv / "bin" / "trainwell")
    env = _clean_env(tmp_path, venv)
    run_dir = tmp_path / "run"
    result = _run([trainwell, "train", "--max_steps", "3", "--output_dir", str(run_dir), "--logging_steps", "1"],
                  cwd=tmp_path, env=env)
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert [e["step"] for e in state["log_history"] if "loss" in e] == [1, 2, 3]
    assert (run_dir / "model.safetensors").is_file() and (run_dir / "train.log").is_file()
    assert "Traceback" not in result.stderr

    _run([trainwell, "plot", str(run_dir)], cwd=tmp_path, env=env)
    assert (run_dir / "training_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    sample = _run([trainwell, "generate", str(run_dir), "x"], cwd=tmp_path, env=env).stdout
    assert sample.startswith("x") and len(sample.strip()) > 1

    report = _run([trainwell, "env"], cwd=tmp_path, env=env).stdout
    assert "trainwell" in report and "torch" in report
    # `trainwell env` names the installed copy, not the checkout
    assert str(REPO / "trainwell") not in report


def test_import_outside_the_checkout_takes_the_installed_copy(installed, tmp_path):
    venv, _ = installed
    env = _clean_env(tmp_path, venv)
    where = _run([str(venv / "bin" / "python"), "-c", "import trainwell, trainwell.cli.main as m; "
                  "print(trainwell.__file__); print(callable(m.main))"], cwd=tmp_path, env=env).stdout.split()
    assert Path(where[0]).is_relative_to(venv), f"imported {where[0]}, not the copy installed in {venv}"
    assert where[1] == "True"


# ------------------------------------------------------------------------------------------ the README's first block


def readme_first_block() -> str:
    """The first fenced bash block of README.md, as written."""
    match = re.search(r"^```bash\n(.*?)^```", README.read_text(), re.S | re.M)
    assert match, "README.md has no bash block"
    return match.group(1)


def test_the_readme_first_block_is_the_main_job():
    block = readme_first_block()
    assert "trainwell train" in block and "pip install" in block and "pytest" not in block


def test_the_readme_first_block_runs_as_written_in_a_fresh_venv(tmp_path):
    source = _checkout_copy(tmp_path / "checkout")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, env=_clean_env(tmp_path, Path(sys.prefix)))
    env = dict(_clean_env(tmp_path, venv), TRAINWELL_RECIPE_MAX_STEPS=QUICK_STEPS)
    result = _run(["bash", "-e", "-c", readme_first_block()], cwd=source, env=env, timeout=1200)
    out = source / "trainwell-output"
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == int(QUICK_STEPS)
    assert (out / "training_curves.png").is_file() and (out / "model.safetensors").is_file()
    assert "Return the" in result.stdout  # the sample
    assert result.stdout.rstrip().splitlines()[-1] in (out / "train.log").read_text()  # `tail` printed the log
    # the command that ran was the fresh environment's own executable
    assert (venv / "bin" / "trainwell").is_file()
