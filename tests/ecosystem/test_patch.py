"""The two routes onto trainwell for libraries built on ``transformers.Trainer``: ``trainwell.patch_transformers()``
(it survives transformers' lazy package re-executing its ``__init__``, refuses to run after TRL / sentence-transformers
/ setfit were imported, and says so in one line when transformers is missing) and ``trainwell run SCRIPT`` (the
script runs as ``__main__`` with its own ``sys.argv``, the exit status is the script's). Each check runs in a fresh
process, so the patch never reaches the test process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def python(code: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=240, cwd=cwd)


def test_the_patch_holds_everywhere_the_classes_are_looked_up():
    out = python("""
        import sys
        import trainwell
        trainwell.patch_transformers()
        trainwell.patch_transformers()  # idempotent
        import transformers.processing_utils  # re-executes transformers' __init__ (a new package object)
        import transformers, transformers.trainer, transformers.training_args
        import transformers.trainer_seq2seq, transformers.training_args_seq2seq
        from transformers import Trainer, TrainingArguments, Seq2SeqTrainer, Seq2SeqTrainingArguments
        assert Trainer is trainwell.Trainer and TrainingArguments is trainwell.TrainingArguments
        assert Seq2SeqTrainer is trainwell.Seq2SeqTrainer
        assert Seq2SeqTrainingArguments is trainwell.Seq2SeqTrainingArguments
        assert transformers.trainer.Trainer is trainwell.Trainer
        assert transformers.training_args.TrainingArguments is trainwell.TrainingArguments
        assert transformers.trainer_seq2seq.Seq2SeqTrainer is trainwell.Seq2SeqTrainer
        assert transformers.training_args_seq2seq.Seq2SeqTrainingArguments is trainwell.Seq2SeqTrainingArguments
        assert sys.modules["transformers"].Trainer is trainwell.Trainer
        from trl import SFTConfig
        assert issubclass(SFTConfig, trainwell.TrainingArguments)
        print("ok")
    """)
    assert out.stdout.strip().endswith("ok"), out.stderr[-3000:]


def test_a_naive_attribute_patch_is_lost_to_the_package_re_execution():
    """Why the patch sets the submodules: the package attribute alone does not survive."""
    out = python("""
        import sys, transformers
        first = sys.modules["transformers"]
        transformers.Trainer = "naive"
        import transformers.processing_utils
        print(sys.modules["transformers"] is first, sys.modules["transformers"].Trainer == "naive")
    """)
    assert out.stdout.split()[-2:] == ["False", "False"], out.stderr[-3000:]


def test_after_the_library_import_the_patch_refuses_with_the_fix():
    out = python("""
        import trl
        import trainwell
        trainwell.patch_transformers()
    """)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "RuntimeError" in last and "after trl was imported" in last and "trainwell run" in last


def test_without_transformers_the_patch_says_so_in_one_line():
    out = python("""
        import sys
        sys.modules["transformers"] = None  # as if not installed
        import trainwell
        try:
            trainwell.patch_transformers()
        except ImportError as err:
            print("ERR", err)
    """)
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("ERR") and "pip install transformers" in line and "\\n" not in line


def test_trainwell_run_runs_the_script_as_main_with_its_arguments(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import sys, transformers, trainwell
        from helper_next_to_job import VALUE
        print("ARGS", __name__, sys.argv, transformers.Trainer is trainwell.Trainer, VALUE)
        sys.exit(int(sys.argv[1]))
    """))
    (tmp_path / "helper_next_to_job.py").write_text("VALUE = 7\n")
    done = subprocess.run([sys.executable, "-m", "trainwell", "run", str(script), "3", "--flag"], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 3, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("ARGS"))
    assert line == f"ARGS __main__ {[str(script), '3', '--flag']} True 7"


def test_trainwell_run_patches_the_python_processes_the_script_launches(tmp_path):
    """A script that launches Python processes (the ``trl`` command: ``trl sft ...`` runs ``trl/scripts/sft.py`` in a
    child through ``accelerate launch``): under ``trainwell run`` each child trains on trainwell too. Before, the
    children ran upstream's Trainer with no word said (``trainwell run $(which trl) sft ...`` trained on
    transformers). A ``sitecustomize`` of the user's, further on the path, still runs in the children; a plain run
    of the same launcher leaves its children unpatched."""
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent("""
        import subprocess, sys
        code = "import sys, transformers; print('CHILD', transformers.Trainer.__module__.split('.')[0], "
        code += "'trainwell' in sys.modules)"
        sys.exit(subprocess.run([sys.executable, "-c", code]).returncode)
    """))
    own_site = tmp_path / "site"
    own_site.mkdir()
    (own_site / "sitecustomize.py").write_text("print('USER SITECUSTOMIZE')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(own_site)]))}
    runs = {how: subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
            for how, cmd in (("run", [sys.executable, "-m", "trainwell", "run", str(launcher)]),
                             ("plain", [sys.executable, str(launcher)]))}
    for how, done in runs.items():
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.count("USER SITECUSTOMIZE") == 2, done.stdout
    child = {how: next(x for x in done.stdout.splitlines() if x.startswith("CHILD")) for how, done in runs.items()}
    assert child["run"].endswith("trainwell True"), child
    assert child["plain"].endswith("transformers False"), child


def test_trainwell_run_names_a_missing_script():
    done = subprocess.run([sys.executable, "-m", "trainwell", "run", "no_such_script.py"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "script 'no_such_script.py' not found" in done.stderr


def test_the_patch_warns_naming_every_class_defined_before_it():
    """A script's (or a package's) subclasses of upstream's Trainer / TrainingArguments built before the patch stay
    on upstream: the patch names each (nested ones too) in one warning; classes of transformers itself and classes
    defined after the patch are not named, and a script without early classes gets no warning."""
    out = python("""
        import warnings
        import transformers
        class MyTrainer(transformers.Trainer): pass
        class Deeper(MyTrainer): pass
        class MyArgs(transformers.TrainingArguments): pass
        import trainwell
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainwell.patch_transformers()
            import transformers as package  # the package object of now (the patch may re-execute its __init__)
            class Later(package.Trainer): pass
            trainwell.patch_transformers()
        texts = [str(w.message) for w in caught if "defined before the patch" in str(w.message)]
        assert len(texts) == 1, texts
        print(texts[0])
        print("LATER", issubclass(Later, trainwell.Trainer), issubclass(MyTrainer, trainwell.Trainer))
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    message, later = out.stdout.strip().splitlines()[-2:]
    for name in ("__main__.MyTrainer", "__main__.Deeper", "__main__.MyArgs"):
        assert name in message
    assert "3 class(es)" in message and "Seq2Seq" not in message and "Later" not in message
    assert "before importing the packages that define them" in message
    assert later == "LATER True False"
    clean = python("""
        import warnings
        import transformers, trainwell
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainwell.patch_transformers()
        print("clean", sum("defined before the patch" in str(w.message) for w in caught))
    """)
    assert clean.stdout.strip().endswith("clean 0"), clean.stderr[-3000:]
