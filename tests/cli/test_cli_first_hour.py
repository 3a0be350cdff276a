"""The first hour as a user of the ``trainwell`` command: one summary that fits 80 columns, plain progress
lines when the output is a file, preemption exit codes with the resume command, ``--resume_from_checkpoint auto``,
one-line errors, ``trainwell env``, ``train.log``, ``trainwell plot`` and ``trainwell generate``."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from trainwell import Trainer, TrainingArguments
from trainwell.cli.main import main
from helpers.launch import ROOT

REPO = ROOT
TINY = ["--max_steps", "6", "--eval_steps", "3", "--save_steps", "3", "--logging_steps", "1",
        "--per_device_train_batch_size", "4", "--per_device_eval_batch_size", "16"]


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``main(argv)`` in this process with stdout/stderr captured (neither is a terminal, as under nohup/SLURM)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One tiny run of the built-in recipe, its output captured as it would be in a log file."""
    folder = tmp_path_factory.mktemp("first-hour") / "run"
    code, out, err = _run_cli(["train", "--output_dir", str(folder), *TINY])
    return {"dir": folder, "code": code, "out": out, "err": err}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    env.pop("TRAINWELL_DEBUG", None)
    return env


def _subprocess(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainwell", *argv], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


# ------------------------------------------------------------------------------------------- summary and output


@pytest.mark.slow  # over a second
def test_one_summary_within_80_columns(finished_run):
    assert finished_run["code"] == 0
    out = finished_run["out"]
    assert "***** train metrics *****" not in out and "***** eval metrics *****" not in out  # printed once only
    assert out.count("trainwell train: summary") == 1
    lines = out[out.index("trainwell train: summary"):].splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    assert not any(line.startswith(("|", "+")) for line in lines)  # no borders a '|' of the sample could imitate
    sample = out[out.index("sample (after 'Return the ', temperature 0.8, seed 0):"):].splitlines()[1:]
    assert sample and all(line.startswith("    ") for line in sample if line)
    assert sample[0].strip().startswith("Return the")


def test_progress_is_plain_lines_when_not_a_terminal(finished_run):
    text = finished_run["out"] + finished_run["err"]
    assert "\r" not in text and "\x1b" not in text  # no tqdm redraws, no escape codes of a nested eval bar
    assert "[trainwell] training: 6 steps" in finished_run["err"]
    assert "[trainwell] step 6/6 (100%)" in finished_run["err"]  # the last step always gets its line
    assert "'eval_loss'" in finished_run["err"]  # logged dicts, one line each


@pytest.mark.slow  # over a second
def test_train_log_in_output_dir_and_appended_on_resume(finished_run, tmp_path):
    log = (finished_run["dir"] / "train.log").read_text()
    assert "training started: max_steps 6" in log and "training ended at step 6" in log
    entries = [json.loads(line.split(" ", 4)[4]) for line in log.splitlines() if " step " in line and "{" in line]
    assert [e["loss"] for e in entries if "loss" in e] and [e for e in entries if "eval_loss" in e]
    # a resumed run appends, and warnings of the run land there too (and still reach the console)
    folder = tmp_path / "run"
    import shutil

    shutil.copytree(finished_run["dir"], folder)
    code, _, err = _run_cli(["train", "--output_dir", str(folder), *TINY[:-4], "--max_steps", "8",
                             "--resume_from_checkpoint", "auto"])
    assert code == 0
    log = (folder / "train.log").read_text()
    assert log.count("training started") == 2 and "resuming at step 6" in log
    assert "training: 8 steps, from step 6" in err


def test_log_file_callback_records_python_warnings(tmp_path):
    from trainwell.callbacks.base import TrainerCallback
    from trainwell.callbacks.logfile import LogFileCallback

    class Warn(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                import warnings

                warnings.warn("a warning raised during training", UserWarning)

    trainer = _tiny_trainer(tmp_path / "out", max_steps=2)
    trainer.add_callback(LogFileCallback())
    trainer.add_callback(Warn())
    with pytest.warns(UserWarning, match="raised during training"):  # still shown to the user
        trainer.train()
    log = (tmp_path / "out" / "train.log").read_text()
    assert "UserWarning: a warning raised during training" in log


# --------------------------------------------------------------------------------------------------- preemption


@pytest.mark.slow
@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_stops_with_status_and_resume_command(tmp_path, sig, status):
    out_dir = tmp_path / "run"
    stderr_file = tmp_path / "stderr.txt"
    argv = ["train", "--output_dir", str(out_dir), "--max_steps", "100000", "--eval_strategy", "no",
            "--save_steps", "100000", "--logging_steps", "100000", "--per_device_train_batch_size", "2"]
    with open(stderr_file, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trainwell", *argv], stdout=subprocess.PIPE, stderr=err,
                                text=True, env=_env())
        try:
            deadline = time.monotonic() + 240
            while "[trainwell] training:" not in stderr_file.read_text():  # the signal handlers are installed
                assert proc.poll() is None, stderr_file.read_text()
                assert time.monotonic() < deadline, "training did not start"
                time.sleep(0.2)
            time.sleep(0.5)
            proc.send_signal(sig)
            stdout, _ = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
    stderr = stderr_file.read_text()
    assert proc.returncode == status, stderr
    assert "Traceback" not in stderr and "summary" not in stdout
    last = stderr.strip().splitlines()[-1]
    checkpoints = sorted(out_dir.glob("checkpoint-*"))
    assert len(checkpoints) == 1 and (checkpoints[0] / "trainer_state.json").is_file()
    step = int(checkpoints[0].name.split("-")[1])
    assert last.startswith(f"trainwell: preempted by {signal.Signals(sig).name} at step {step}, checkpoint ")
    assert str(checkpoints[0]) in last
    assert last.endswith(" --resume_from_checkpoint auto")
    assert f"resume with: trainwell train --output_dir {out_dir} --max_steps 100000" in last
    log = (out_dir / "train.log").read_text()  # the run's log file says it too
    assert f"Training preempted by {signal.Signals(sig).name} at step {step}" in log


# -------------------------------------------------------------------------------------------- resume "auto"


def _tiny_trainer(out_dir: Path, max_steps: int = 4, **kwargs) -> Trainer:
    from helpers import RegressionModel, regression_data

    torch.manual_seed(0)
    args = TrainingArguments(output_dir=str(out_dir), max_steps=max_steps, per_device_train_batch_size=4,
                             save_steps=2, logging_steps=1, report_to="none", disable_tqdm=True, **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16))


def test_resume_auto_starts_fresh_then_resumes(tmp_path, caplog):
    out_dir = tmp_path / "out"
    with caplog.at_level("WARNING", logger="trainwell"):
        first = _tiny_trainer(out_dir).train(resume_from_checkpoint="auto")
    assert first.global_step == 4 and "no checkpoint in" in caplog.text and "training from scratch" in caplog.text
    caplog.clear()
    trainer = _tiny_trainer(out_dir, max_steps=6)
    with caplog.at_level("WARNING", logger="trainwell"):
        result = trainer.train(resume_from_checkpoint="auto")
    resumed = [r.getMessage() for r in caplog.records if "resuming from" in r.getMessage()]
    assert len(resumed) == 1, resumed  # one line, not an 'auto' line and a True line
    assert resumed[0].startswith(f"resume_from_checkpoint='auto': resuming from {out_dir / 'checkpoint-4'}, the newest")
    assert resumed[0].endswith("(local; an older one is used if it is damaged)")
    assert result.global_step == 6 and trainer.state.log_history[0]["step"] == 1  # history carried over


def test_resume_auto_from_training_arguments(tmp_path, caplog):
    out_dir = tmp_path / "out"
    _tiny_trainer(out_dir).train()
    trainer = _tiny_trainer(out_dir, max_steps=6, resume_from_checkpoint="auto")
    with caplog.at_level("WARNING", logger="trainwell"):
        trainer.train()
    assert "resume_from_checkpoint='auto': resuming from" in caplog.text


@pytest.mark.slow
def test_resume_last_on_fresh_folder_is_one_line(tmp_path):
    out_dir = tmp_path / "fresh"
    result = _subprocess(["train", "--output_dir", str(out_dir), "--resume_from_checkpoint", "last"])
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "holds no checkpoint" in result.stderr and "--resume_from_checkpoint auto" in result.stderr
    assert not out_dir.exists()  # nothing written


# ------------------------------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize("argv, expected", [
    (["train", "--resume_from_checkpoint", "{tmp}/nope"], "no such checkpoint folder"),
    (["train", "--report_to", "azure_ml"], "report_to"),
    (["estimate-memory", "--params", "-5"], "must be a positive number, got -5"),
    (["estimate-memory", "--params", "1e9", "--gpus", "0"], "--gpus: must be >= 1, got 0"),
    (["zero-to-fp32", "{tmp}/missing", "{tmp}/out.safetensors"], "no such checkpoint folder"),
    (["zero-to-fp32", "{tmp}/plain", "{tmp}/out.safetensors"], "not a DeepSpeed checkpoint"),
    (["plot", "{tmp}/missing"], "no such folder"),
    (["generate", "{tmp}/plain"], "no config.json and vocab.json"),
])
def test_errors_are_one_line(tmp_path, capsys, argv, expected):
    if argv[0] == "plot":
        pytest.importorskip("matplotlib")  # without it, the missing package is the error named first
    (tmp_path / "plain").mkdir()
    argv = [a.format(tmp=tmp_path) for a in argv]
    if argv[0] == "train":
        argv += ["--output_dir", str(tmp_path / "out"), "--max_steps", "2"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert err.startswith("trainwell: error: ") and err.count("\n") == 1, err
    assert expected in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain"]  # nothing written


@pytest.mark.slow
def test_no_traceback_in_a_real_subprocess_and_debug_shows_it(tmp_path):
    result = _subprocess(["zero-to-fp32", str(tmp_path / "missing"), str(tmp_path / "out.pt")])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("trainwell: error: FileNotFoundError: ") and "--debug" in result.stderr
    debug = _subprocess(["--debug", "zero-to-fp32", str(tmp_path / "missing"), str(tmp_path / "out.pt")])
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr


def test_debug_env_variable_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINWELL_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="no such checkpoint folder"):
        main(["zero-to-fp32", str(tmp_path / "missing"), str(tmp_path / "out.pt")])


def test_deepspeed_mismatch_is_reported_before_start_up(tmp_path, capsys):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8,
                                  "optimizer": {"type": "AdamW", "params": {"lr": 0.1}}}))
    started = time.monotonic()
    code = main(["train", "--deepspeed", str(config), "--output_dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "train_micro_batch_size_per_gpu: config value 8 != TrainingArguments.per_device_train_batch_size" in err
    assert "optimizer.params.lr" in err and '"auto"' in err
    assert "deepspeed" not in sys.modules or time.monotonic() - started < 30  # no engine, no recipe built
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------------ env, plot, gen


def test_env_lists_versions_for_a_bug_report(capsys):
    import platform

    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ("trainwell:", "platform:", "python:", "torch:", "CUDA (torch built with):", "CUDA available:",
                 "deepspeed:", "transformers:", "accelerate:", "distributed backends:"):
        assert f"- {name}" in out, name
    assert torch.__version__ in out and platform.python_version() in out


def test_plot_writes_a_png_with_a_panel_per_quantity(finished_run, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    from trainwell.cli.commands.plot import _panels, collect_series

    out = tmp_path / "curves.png"
    assert main(["plot", str(finished_run["dir"]), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    history = json.loads((finished_run["dir"] / "trainer_state.json").read_text())["log_history"]
    panels = _panels(collect_series(history))
    assert [title for title, _ in panels] == ["loss", "learning rate", "gradient norm"]
    assert panels[0][1] == ["loss", "eval_loss"]
    # eval metrics get their own panels; runtime/throughput do not
    history = [{"step": 1, "loss": 2.0}, {"step": 2, "eval_loss": 1.5, "eval_accuracy": 0.5, "eval_runtime": 3.0},
               {"step": 2, "train_runtime": 9.0, "train_loss": 1.9}]
    assert [t for t, _ in _panels(collect_series(history))] == ["loss", "accuracy"]


def test_plot_of_a_running_run_reads_the_newest_checkpoint(finished_run, tmp_path):
    pytest.importorskip("matplotlib")
    import shutil

    from trainwell.cli.commands.plot import find_state_file

    folder = tmp_path / "running"
    folder.mkdir()
    for checkpoint in finished_run["dir"].glob("checkpoint-*"):
        shutil.copytree(checkpoint, folder / checkpoint.name)
    newest = max(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert find_state_file(folder) == newest / "trainer_state.json"
    assert main(["plot", str(folder)]) == 0 and (folder / "training_curves.png").is_file()


def test_plot_without_matplotlib_names_the_extra(finished_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if not installed
    assert main(["plot", str(finished_run["dir"]), "--out", str(tmp_path / "x.png")]) == 2
    assert "pip install 'trainwell[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_generate_samples_from_the_saved_model(finished_run, capsys):
    config = json.loads((finished_run["dir"] / "config.json").read_text())
    assert config["model_type"] == "trainwell-charlm" and config["d_model"] == 96
    argv = ["generate", str(finished_run["dir"]), "def f", "--length", "30", "--seed", "3"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert first.startswith("def f") and len(first) == len("def f") + 30 + 1  # the prompt, 30 characters, "\n"
    assert main(argv) == 0 and capsys.readouterr().out == first  # deterministic for a seed
    checkpoint = sorted(finished_run["dir"].glob("checkpoint-*"))[-1]
    assert main(["generate", str(checkpoint), "def f", "--length", "5"]) == 0  # config found in the parent


def test_the_summary_sample_is_the_start_of_what_generate_prints(finished_run, capsys):
    """Same prompt, same decoding (temperature, seed) as ``trainwell generate``'s defaults: the summary's sample is
    the beginning of generate's (which used to sample with the training seed instead: another text)."""
    from trainwell.cli.commands.generate import load_charlm
    from trainwell.cli.recipes import SAMPLE_PROMPT, summary_sample

    model, vocab = load_charlm(finished_run["dir"])
    sample = summary_sample(model, vocab)
    assert main(["generate", str(finished_run["dir"])]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(SAMPLE_PROMPT + sample) and len(printed) > len(SAMPLE_PROMPT + sample)


@pytest.mark.slow
def test_help_piped_into_head_is_quiet():
    result = subprocess.run(["bash", "-c", f'"{sys.executable}" -m trainwell train --help | head -1'],
                            capture_output=True, text=True, env=_env(), timeout=120)
    assert result.stdout.startswith("usage: trainwell train") and result.stderr == ""


def test_generate_samples_on_the_built_in_recipes_thread_count(finished_run, capsys, monkeypatch):
    """torch's default threads (one per core) made sampling 3 to 4 times slower on a busy machine; like the built-in
    recipe's training, generate uses one thread unless OMP_NUM_THREADS chooses."""
    import torch

    chosen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["generate", str(finished_run["dir"]), "def f", "--length", "5"]) == 0
    assert chosen == [1]
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert main(["generate", str(finished_run["dir"]), "def f", "--length", "5"]) == 0
    assert chosen == [1]  # the user's choice stands


@pytest.mark.parametrize("flags", [["--model", "./my-model"], ["--model_name_or_path=gpt2"]])
def test_a_model_path_flag_points_to_recipes_not_to_hub_model_id(flags, capsys, tmp_path):
    assert main(["train", "--output_dir", str(tmp_path / "run"), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainwell: error: unknown argument {flags[0].split('=')[0]}: 'trainwell train' takes no "
                          "model path; to train a model of your own, write a recipe")
    assert "trainwell train my_recipe.yaml" in err and "examples/recipe.yaml" in err
    assert "hub_model_id" not in err
    assert not (tmp_path / "run").exists()
