"""The suite's DeepSpeed op build (helpers.deepspeed_ops): a build killed at its limit leaves no process and no lock
behind, so the next build (the next DeepSpeed test) does not wait on it."""

from __future__ import annotations

import time

import pytest

from helpers.deepspeed_ops import build_cpu_adam


@pytest.mark.slow
def test_a_build_killed_at_its_limit_leaves_nothing_that_blocks_the_next(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    # A fresh folder: it must compile. One compiler at a time (MAX_JOBS=1, read by torch's extension build) keeps it
    # compiling past the limit even on an idle machine (its two files in parallel took ~40 s there, under the 45 s
    # limit this test had).
    monkeypatch.setenv("MAX_JOBS", "1")
    with pytest.raises(pytest.fail.Exception, match="took over 30s") as failed:
        build_cpu_adam(timeout=30)
    assert "cpu_adam/lock" in str(failed.value)  # the lock it held was found and removed
    assert not (tmp_path / "extensions" / "cpu_adam" / "lock").exists()
    time.sleep(1)
    assert not _processes_in(tmp_path / "extensions")  # ninja and the compilers went with it


def _processes_in(folder) -> list[str]:
    """Command lines of the processes running in ``folder`` (the build's ninja and compilers)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(folder) in str((entry / "cwd").resolve()):
                    found.append((entry / "cmdline").read_text())
            except OSError:
                continue
    return found
