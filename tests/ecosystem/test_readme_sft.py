"""The README's SFT example ("Under TRL, sentence-transformers, PEFT and setfit") runs as written under
``trainwell run``, with a tiny offline Llama in place of the hub model it names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from world import build_tiny_llama

pytestmark = pytest.mark.slow
README = Path(__file__).resolve().parents[2] / "README.md"
HUB_MODEL = "Qwen/Qwen2.5-0.5B"


def sft_block() -> str:
    """The python block of README.md that starts with ``# sft.py``."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    return next(block for block in blocks if block.startswith("# sft.py"))


def test_the_readme_sft_example_runs_under_trainwell_run(tmp_path):
    block = sft_block()
    assert HUB_MODEL in block
    model = build_tiny_llama(tmp_path / "model")
    script = tmp_path / "sft.py"
    script.write_text(block.replace(HUB_MODEL, str(model)))
    done = subprocess.run([sys.executable, "-m", "trainwell", "run", str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trainwell Trainer under trl.SFTTrainer" in done.stdout
    assert (tmp_path / "sft-out" / "model.safetensors").is_file()
