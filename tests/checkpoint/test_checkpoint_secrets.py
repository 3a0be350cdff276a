"""Credentials stay out of everything a run writes (``trainwell/utils/secrets.py``): the pickled and the JSON arguments
of every checkpoint and of ``save_model``, ``trainer_state.json``, the run's log file, the model card and the logs; a
resume from such a checkpoint takes the credential from its new arguments."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from helpers import RegressionModel, regression_data
from trainwell import Trainer, TrainingArguments
from trainwell.utils.secrets import is_secret_field, without_secrets
from trainwell.callbacks.logfile import LogFileCallback

SECRET = "hf_SECRETVALUE0123456789abcdefXYZ"


def _trainer(out: Path, max_steps: int, token: str, **kwargs) -> Trainer:
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=str(out), max_steps=max_steps, save_steps=2, per_device_train_batch_size=4,
                             logging_steps=1, report_to="none", disable_tqdm=True, hub_token=token,
                             log_level="info", **kwargs)
    return Trainer(model=RegressionModel(), args=args, train_dataset=regression_data(16),
                   eval_dataset=regression_data(8))


def _files_holding(root: Path, secret: str) -> list[str]:
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*"))
            if p.is_file() and secret.encode() in p.read_bytes()]


def test_no_file_of_the_run_nor_its_log_holds_the_hub_token(tmp_path, caplog, capsys):
    pytest.importorskip("huggingface_hub")  # create_model_card needs it (the `test` extra; not `test-fast`)
    out = tmp_path / "R"
    trainer = _trainer(out, 4, SECRET, eval_strategy="steps", eval_steps=2)
    trainer.add_callback(LogFileCallback(level=logging.INFO))
    with caplog.at_level(logging.DEBUG):
        trainer.train()
        trainer.save_model()
        trainer.save_state()
        trainer.create_model_card(model_name="m")
        trainer.log_metrics("train", {"loss": 1.0})
    assert trainer.args.hub_token == SECRET  # the arguments in use keep it
    assert (out / "checkpoint-4" / "training_args.bin").is_file() and (out / "training_args.bin").is_file()
    assert (out / "README.md").is_file() and (out / "train.log").is_file()
    assert _files_holding(out, SECRET) == []
    assert SECRET not in caplog.text
    printed = capsys.readouterr()
    assert SECRET not in printed.out + printed.err
    assert SECRET not in str(trainer.args) and SECRET not in trainer.args.to_json_string()
    saved = torch.load(out / "checkpoint-4" / "training_args.bin", weights_only=False)
    assert saved.hub_token is None and saved.learning_rate == trainer.args.learning_rate


def test_a_resume_from_a_checkpoint_without_the_token_uses_the_new_arguments(tmp_path):
    out = tmp_path / "R"
    _trainer(out, 2, SECRET).train()
    again = _trainer(out, 4, "hf_OTHER_TOKEN_FOR_THE_RESUME")
    again.train(resume_from_checkpoint=True)
    assert again.state.global_step == 4 and again._tw_checkpoints.resumed_from == out / "checkpoint-2"
    assert again.args.hub_token == "hf_OTHER_TOKEN_FOR_THE_RESUME"
    assert _files_holding(out, "hf_OTHER_TOKEN_FOR_THE_RESUME") == [] and _files_holding(out, SECRET) == []


def test_which_fields_are_credentials():
    assert [name for name in ("hub_token", "push_to_hub_token", "db_password", "client_secret", "storage_options",
                              "wandb_api_key", "include_tokens_per_second", "average_tokens_across_devices",
                              "hub_model_id") if is_secret_field(name)] == \
        ["hub_token", "push_to_hub_token", "db_password", "client_secret", "storage_options", "wandb_api_key"]
    args = TrainingArguments(output_dir="x", hub_token=SECRET)
    clean = without_secrets(args)
    assert clean is not args and clean.hub_token is None and args.hub_token == SECRET
    plain = TrainingArguments(output_dir="x")
    assert without_secrets(plain) is plain
