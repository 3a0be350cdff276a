"""Resuming as upstream's own trainer tests expect (found by running them on trainwell; see the module's tests).

Each test runs the same body on ``transformers.Trainer`` and on trainwell's, and compares: the first sentence of the
resume errors (scripts and tests match it), a model whose own ``load_state_dict`` resizes a buffer to the saved
shape, and the warning naming the arguments that differ from the checkpoint's.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

import trainwell
from helpers.data import regression_data
from helpers.models import RegressionModel

pytestmark = pytest.mark.slow  # trains and resumes on both libraries: over a second a test

transformers = pytest.importorskip("transformers")


def _args(lib, output_dir, **kw):
    common = dict(output_dir=str(output_dir), per_device_train_batch_size=4, report_to="none", use_cpu=True,
                  disable_tqdm=True, save_strategy="no", seed=7)
    common.update(kw)
    return lib.TrainingArguments(**common)


def _resume_error(lib, output_dir, resume) -> str:
    output_dir.mkdir(parents=True)  # an empty output_dir, as upstream's test gets from its temporary folder
    trainer = lib.Trainer(model=RegressionModel(), args=_args(lib, output_dir, max_steps=1),
                          train_dataset=regression_data(8))
    with pytest.raises(ValueError) as caught:
        trainer.train(resume_from_checkpoint=resume)
    return str(caught.value)


@pytest.mark.parametrize("case", ["missing folder", "no checkpoint in output_dir"])
def test_resume_errors_begin_with_upstreams_sentence(tmp_path, case):
    def resume(lib):
        out = tmp_path / lib.__name__
        return str(out / "checkpoint-5-bogus") if case == "missing folder" else True

    upstream = _resume_error(transformers, tmp_path / "transformers", resume(transformers))
    ours = _resume_error(trainwell, tmp_path / "trainwell", resume(trainwell))
    assert upstream.startswith(("Can't find a valid checkpoint at", "No valid checkpoint found in output directory"))
    assert ours.startswith(upstream.replace("transformers", "trainwell")), (upstream, ours)


class BatchLog(nn.Module):
    """A regression model whose buffer logs every row it saw: it grows each step, and its own ``load_state_dict``
    resizes it to the saved length (as upstream's test_resume_batch_order model does)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = RegressionModel()
        self.register_buffer("seen", torch.empty(0))

    def load_state_dict(self, state_dict, strict=True, assign=False):
        if "seen" in state_dict and state_dict["seen"].shape != self.seen.shape:
            self.seen = state_dict["seen"].clone()
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def forward(self, x, labels=None):
        self.seen = torch.cat([self.seen, x[:, 0].detach()])
        return self.inner(x, labels)


def _batch_log_run(lib, output_dir, resume=None) -> torch.Tensor:
    torch.manual_seed(0)
    model = BatchLog()
    args = _args(lib, output_dir, max_steps=4, save_strategy="steps", save_steps=1, learning_rate=0.1)
    trainer = lib.Trainer(model=model, args=args, train_dataset=regression_data(16))
    trainer.train(resume_from_checkpoint=resume)
    return trainer.model.seen.clone()


def test_model_resizing_its_buffer_on_load_resumes_as_upstream(tmp_path):
    results = {}
    for lib in (transformers, trainwell):
        full = _batch_log_run(lib, tmp_path / lib.__name__ / "full")
        resumed = _batch_log_run(lib, tmp_path / lib.__name__ / "resumed",
                                 resume=str(tmp_path / lib.__name__ / "full" / "checkpoint-2"))
        assert full.shape == (16,)
        torch.testing.assert_close(resumed, full, rtol=0, atol=0)  # the ground truth: the same rows, in order
        results[lib.__name__] = full
    torch.testing.assert_close(results["trainwell"], results["transformers"], rtol=0, atol=0)


def _changed_arguments_warning(lib, output_dir, caplog) -> list[str]:
    first = lib.Trainer(model=RegressionModel(), train_dataset=regression_data(32),
                        args=_args(lib, output_dir, max_steps=4, save_strategy="steps", save_steps=2,
                                   logging_steps=2))
    first.train()
    second = lib.Trainer(model=RegressionModel(), train_dataset=regression_data(32),
                         args=_args(lib, output_dir, max_steps=6, save_strategy="steps", save_steps=3,
                                    logging_steps=2, per_device_train_batch_size=2))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        second.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))
    return sorted({line.strip() for r in caplog.records if "(from trainer_state.json)" in r.getMessage()
                   for line in r.getMessage().splitlines() if "(from args)" in line})


def test_resume_with_changed_arguments_warns_in_upstreams_words(tmp_path, caplog, monkeypatch):
    expected = ["per_device_train_batch_size: 2 (from args) != 4 (from trainer_state.json)",
                "save_steps: 3 (from args) != 2 (from trainer_state.json)"]
    # upstream's library logger does not propagate by default; caplog listens at the root
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    assert _changed_arguments_warning(transformers, tmp_path / "transformers", caplog) == expected
    assert _changed_arguments_warning(trainwell, tmp_path / "trainwell", caplog) == expected


def _to_shards(folder) -> None:
    """Replace ``folder``'s model.safetensors by one shard per tensor and an index, as a user converting it would."""
    import json

    from safetensors.torch import load_file, save_file

    state = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = {key: f"model-{i + 1:05d}-of-{len(state):05d}.safetensors" for i, key in enumerate(sorted(state))}
    for key, name in names.items():
        save_file({key: state[key].contiguous()}, folder / name)
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))


def _resharded_resume(lib, output_dir) -> dict[str, torch.Tensor]:
    def trainer():
        torch.manual_seed(0)
        return lib.Trainer(model=RegressionModel(), train_dataset=regression_data(32),
                           args=_args(lib, output_dir, max_steps=4, save_strategy="steps", save_steps=2,
                                      learning_rate=0.1))

    full = trainer()
    full.train()
    _to_shards(output_dir / "checkpoint-2")
    resumed = trainer()
    resumed.train(resume_from_checkpoint=str(output_dir / "checkpoint-2"))
    for name, tensor in full.model.state_dict().items():  # the ground truth: the uninterrupted run
        torch.testing.assert_close(resumed.model.state_dict()[name], tensor, rtol=0, atol=0)
    return {k: v.clone() for k, v in resumed.model.state_dict().items()}


def test_checkpoint_converted_to_shards_after_saving_resumes_as_upstream(tmp_path):
    upstream = _resharded_resume(transformers, tmp_path / "transformers")
    ours = _resharded_resume(trainwell, tmp_path / "trainwell")
    for name, tensor in upstream.items():
        torch.testing.assert_close(ours[name], tensor)
