"""The README's first example (the Quick tour's classifier) visibly learns and gives the same result every run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _quick_tour() -> str:
    text = README.read_text()
    section = text[text.index("### Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _accuracy(folder: Path, monkeypatch: pytest.MonkeyPatch) -> float:
    folder.mkdir()
    monkeypatch.chdir(folder)
    code = _quick_tour().replace("print(trainer.evaluate())", "result = trainer.evaluate()")
    namespace: dict = {}
    exec(compile(code, "README.md (Quick tour)", "exec"), namespace)
    return float(namespace["result"]["eval_accuracy"])


@pytest.mark.slow
def test_the_quick_tour_classifier_learns_and_repeats(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    first = _accuracy(tmp_path / "a", monkeypatch)
    assert first > 0.5  # chance is 0.10 (10 classes)
    assert _accuracy(tmp_path / "b", monkeypatch) == first
