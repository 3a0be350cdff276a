"""Every code block of README.md and docs/*.md runs as written, so the documentation cannot drift from the code.

* ``python`` blocks run with ``exec`` in a temporary working folder. A block that continues an example (uses a
  ``trainer`` or ``args`` it does not define) names its set-up in an HTML comment just before it:
  ``<!-- run-with: NAME -->``, NAME being one of :data:`CONTEXTS` (a tiny trained ``trainer``...) or ``previous``
  (the namespace the previous Python block of the same file left).
* ``bash`` blocks run with ``bash -e`` in a temporary folder where ``examples/`` is the repository's; ``trainwell`` is
  the command of this checkout (with TRAINWELL_DEBUG=1, so a failure shows its traceback), and ``trainwell train`` gets small step counts appended (``TRAIN_STEPS``), which
  override the block's own, so the whole file stays quick.
* ``yaml`` blocks that are recipes must name factories that exist in ``examples/``.
* A block that another test runs as written (the README's first block: a fresh virtual environment, the installed
  ``trainwell`` executable) is marked ``<!-- run-by: tests/FILE.py (how) -->``; :func:`test_run_by_blocks_are_run`
  checks that the file exists and reads the block from the document.
* A block that cannot run here (8 GPUs, SLURM, installing packages) is marked ``<!-- not-run: why -->`` just before
  it; those are skipped and listed by :func:`test_not_run_blocks_are_listed`.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LANGUAGES = {"python": "python", "py": "python", "bash": "bash", "sh": "bash", "shell": "bash", "yaml": "yaml"}
#: Appended to every ``trainwell train`` of a bash block (argparse keeps the last value of a repeated flag).
TRAIN_STEPS = ["--max_steps", "2", "--eval_steps", "2", "--save_steps", "2", "--logging_steps", "1",
               "--per_device_eval_batch_size", "64"]
_MARKER = re.compile(r"<!--\s*(not-run|run-with|run-by)\s*:\s*(.*?)\s*-->", re.S)


@dataclass
class Block:
    """A fenced code block: where it is, its language, its code and the marker comment before it."""

    document: Path
    line: int
    language: str
    code: str
    marker: tuple[str, str] | None

    @property
    def id(self) -> str:
        return f"{self.document.relative_to(REPO)}:{self.line}"


def extract_blocks(document: Path) -> list[Block]:
    """The fenced blocks of ``document`` in a language of :data:`LANGUAGES` (plain ``` blocks are output samples)."""
    lines = document.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        language = LANGUAGES.get(fence.group(1).lower())
        if language is None:
            continue
        before = "\n".join(lines[max(0, start - 3):start])  # the marker sits on the lines just before the fence
        found = list(_MARKER.finditer(before))
        marker = None
        if found:
            kind, value = found[-1].group(1), found[-1].group(2)
            marker = (kind, value.split()[0] if kind == "run-with" and value else value)  # run-with: NAME (why)
        blocks.append(Block(document, start + 1, language, "\n".join(body) + "\n", marker))
    return blocks


ALL_BLOCKS = [block for document in DOCUMENTS for block in extract_blocks(document)]


# ------------------------------------------------------------------------------------------------- contexts


def _trained_trainer() -> dict:
    """``trainer`` (a tiny regression model trained for 1,200 steps, checkpoints 600 and 1200 in ``out``), its
    ``args``/``training_args``, ``model``, ``train_ds``, and the names the docs use without importing."""
    import logging
    from pathlib import Path as _Path

    import torch
    from torch import nn

    from trainwell import Trainer, TrainingArguments
    from trainwell.trainer_utils import get_last_checkpoint

    class Regression(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(2, 1)

        def forward(self, x, labels=None):
            pred = self.linear(x).squeeze(-1)
            return {"loss": nn.functional.mse_loss(pred, labels), "logits": pred}

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 2, generator=g)
    train_ds = [{"x": x[i], "labels": x[i, 0] - 2 * x[i, 1]} for i in range(64)]
    args = TrainingArguments(output_dir="out", max_steps=1200, per_device_train_batch_size=8, save_steps=600,
                             logging_steps=600, report_to="none", disable_tqdm=True)
    model = Regression()
    trainer = Trainer(model=model, args=args, train_dataset=train_ds)
    trainer.train()
    return {"torch": torch, "nn": nn, "Trainer": Trainer, "TrainingArguments": TrainingArguments,
            "get_last_checkpoint": get_last_checkpoint, "Path": _Path, "sys": sys, "model": model,
            "train_ds": train_ds, "args": args, "training_args": args, "trainer": trainer,
            "logger": logging.getLogger("my_script")}


CONTEXTS = {"trainer": _trained_trainer}


# ---------------------------------------------------------------------------------------------------- runners


def _run_python(block: Block, namespace: dict) -> dict:
    code = compile(block.code, block.id, "exec")
    exec(code, namespace)
    return namespace


def _shim(folder: Path) -> Path:
    """A ``trainwell`` executable that runs this checkout's CLI, with :data:`TRAIN_STEPS` after ``train``."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    script = bin_dir / "trainwell"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = train ] && [ "$2" != --help ]; then exec "{sys.executable}" -m trainwell "$@" '
        + " ".join(TRAIN_STEPS) + "\nfi\n"
        f'exec "{sys.executable}" -m trainwell "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def _run_bash(block: Block, cwd: Path) -> subprocess.CompletedProcess:
    (cwd / "examples").symlink_to(REPO / "examples")
    env = dict(os.environ, PATH=f"{_shim(cwd)}{os.pathsep}{os.environ['PATH']}", OMP_NUM_THREADS="1",
               TRAINWELL_DEBUG="1",
               PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return subprocess.run(["bash", "-e", "-c", block.code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _check_yaml(block: Block) -> None:
    import yaml

    from trainwell.cli.recipes.config import RECIPE_KEYS, load_object

    data = yaml.safe_load(block.code)
    if not (isinstance(data, dict) and "model" in data):
        return
    assert set(data) <= set(RECIPE_KEYS), f"{block.id}: unknown recipe keys {set(data) - set(RECIPE_KEYS)}"
    sys.path.insert(0, str(REPO / "examples"))
    try:
        for key, spec in data.items():
            if key == "args":
                continue
            path = spec["factory"] if isinstance(spec, dict) else spec
            assert callable(load_object(path, key=key, source=block.id)), f"{block.id}: {path} is not callable"
    finally:
        sys.path.remove(str(REPO / "examples"))


# ------------------------------------------------------------------------------------------------------ tests


def test_blocks_were_found():
    languages = {b.language for b in ALL_BLOCKS}
    assert {"python", "bash", "yaml"} <= languages and len(ALL_BLOCKS) >= 15


def test_not_run_blocks_are_listed(capsys):
    """The blocks skipped on purpose, each with its reason (shown with ``pytest -s``)."""
    skipped = [(b.id, b.marker[1]) for b in ALL_BLOCKS if b.marker and b.marker[0] == "not-run"]
    with capsys.disabled():
        print("\nblocks not run:\n" + "\n".join(f"  {where}: {why}" for where, why in skipped))
    assert all(why for _, why in skipped), "every not-run marker says why"
    unknown = [b.id for b in ALL_BLOCKS if b.marker and b.marker[0] == "run-with"
               and b.marker[1] not in {*CONTEXTS, "previous"}]
    assert not unknown, f"run-with names an unknown context: {unknown}"


def test_run_by_blocks_are_run():
    """A ``run-by`` block names a test file that reads it from its document (so the two cannot drift apart)."""
    run_by = [b for b in ALL_BLOCKS if b.marker and b.marker[0] == "run-by"]
    assert run_by, "the README's first block is run by tests/test_installed_package.py"
    for block in run_by:
        test_file = REPO / block.marker[1].split()[0]
        assert test_file.is_file(), f"{block.id}: run-by names {test_file}, which does not exist"
        assert block.document.name in test_file.read_text(), f"{test_file} does not read {block.document.name}"


@pytest.mark.slow
@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_document_blocks_run(document, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    previous: dict = {}
    ran = 0
    for block in (b for b in ALL_BLOCKS if b.document == document):
        if block.marker and block.marker[0] in ("not-run", "run-by"):
            continue
        if block.language == "python":
            name = block.marker[1] if block.marker and block.marker[0] == "run-with" else None
            if name == "previous":
                namespace = previous
            else:
                namespace = {"__name__": "__doc_block__"}
                if name is not None:
                    folder = tmp_path / f"ctx-{block.line}"
                    folder.mkdir()
                    monkeypatch.chdir(folder)
                    namespace.update(CONTEXTS[name]())
            try:
                previous = _run_python(block, namespace)
            except SystemExit as exc:  # a documented sys.exit(0) path
                assert exc.code in (0, None), f"{block.id} exited with {exc.code}"
            monkeypatch.chdir(tmp_path)
        elif block.language == "bash":
            folder = tmp_path / f"sh-{block.line}"
            folder.mkdir()
            result = _run_bash(block, folder)
            assert result.returncode == 0, f"{block.id} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            assert "Traceback" not in result.stderr, f"{block.id}:\n{result.stderr[-3000:]}"
        else:
            _check_yaml(block)
        ran += 1
