"""``trainer_state.json`` sizes epochs as the installed ``transformers`` does when the last accumulation group of an
epoch is partial: 8 micro-batches with ``gradient_accumulation_steps=3`` are 3 optimizer steps (3 + 3 + 2).

transformers 4.x sized an epoch as ``len(dataloader) // gradient_accumulation_steps`` (2 here), so with
``max_steps=3`` its file said ``num_train_epochs`` 2 for a run that takes one epoch; transformers 5.x and trainwell
say 1 (the README's differences table).
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers.models import SeededRegressor

transformers = pytest.importorskip("transformers")


def _state(lib, out, max_steps, epochs) -> dict:
    g = torch.Generator().manual_seed(0)
    data = [{"x": torch.randn(3, generator=g), "labels": torch.tensor(1.0)} for _ in range(16)]  # 8 micro-batches
    args = lib.TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, gradient_accumulation_steps=3,
                                 max_steps=max_steps, num_train_epochs=epochs, save_strategy="no", report_to="none",
                                 disable_tqdm=True, use_cpu=True, logging_steps=100)
    trainer = lib.Trainer(model=SeededRegressor(), args=args, train_dataset=data)
    trainer.train()
    trainer.save_state()
    state = json.loads((out / "trainer_state.json").read_text())
    return {key: state[key] for key in ("num_train_epochs", "max_steps", "global_step")} | {
        "epoch": round(state["epoch"], 6)}


@pytest.mark.parametrize("max_steps,epochs,expected", [
    (3, 1, {"num_train_epochs": 1, "max_steps": 3, "global_step": 3, "epoch": 1.0}),  # 4.x: num_train_epochs 2
    (4, 1, {"num_train_epochs": 2, "max_steps": 4, "global_step": 4, "epoch": 1.375}),
    (-1, 1.5, {"num_train_epochs": 2, "max_steps": 5, "global_step": 5, "epoch": 1.75}),
])
@pytest.mark.slow  # over a second
def test_partial_last_group_sizes_epochs_as_upstream(tmp_path, max_steps, epochs, expected):
    import trainwell

    transformers.logging.set_verbosity_error()
    ours = _state(trainwell, tmp_path / "ours", max_steps, epochs)
    theirs = _state(transformers, tmp_path / "theirs", max_steps, epochs)
    assert ours == theirs == expected
