"""The one-batch look-ahead keeps the random states before each fetch only for loaders that draw.

A collator declaring ``deterministic`` is believed; an undeclared one (a user's plain function) is watched on its
first fetches, and the copies stop when none of them drew, so a deterministic user collator costs nothing per batch
while a drawing one (random augmentation) still resumes bit-exactly.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from helpers.data import classification_data
from helpers.tensors import weights
from torch import nn
from torch.nn import functional as F

from trainwell import Trainer, TrainingArguments
from trainwell.checkpoint.rng import capture_rng_state, read_rng_file, restore_rng_state, rng_states_equal
from trainwell.loops.look_ahead import WATCHED_FETCHES, BatchLookAhead


def _drawing(n: int) -> Any:
    for i in range(n):
        yield i + torch.rand(()).item()  # collating draws from the global torch stream


def test_an_undeclared_deterministic_loader_is_watched_then_left_alone():
    look = BatchLookAhead(None)
    batches = look.batches(iter(range(30)))
    seen = [next(batches) for _ in range(WATCHED_FETCHES)]
    assert seen == list(range(WATCHED_FETCHES))
    assert not look.keeps_states and look.state_dict() == {}  # every watched fetch left the streams as they were
    assert list(batches) == list(range(WATCHED_FETCHES, 30))


def test_a_drawing_loader_keeps_the_states_before_each_fetch():
    look = BatchLookAhead(None)
    batches = look.batches(_drawing(20))
    for _ in range(15):
        next(batches)
        held = look.state_dict()
        assert held and look.keeps_states
        # the states from before the held batch's fetch: restored, the same fetch draws the same number again
        now = capture_rng_state()
        assert not rng_states_equal(held, now)
    assert len(list(batches)) == 5 and look.state_dict() == {}


@pytest.mark.parametrize("declared", [True, False])
def test_a_declaration_is_believed(declared):
    look = BatchLookAhead(declared)
    batches = look.batches(iter(range(20)))
    for _ in range(12):
        next(batches)
    assert look.keeps_states is declared  # True: kept although nothing drew; False: never taken
    assert bool(look.state_dict()) is declared


def _drawing_from(start: int, n: int) -> Any:
    for i in range(start, start + n):
        yield i + torch.rand(()).item()


def test_its_state_round_trips_and_a_resumed_epoch_fetches_its_first_batch_from_it():
    torch.manual_seed(1)
    look = BatchLookAhead(True)
    batches = look.batches(_drawing(10))
    next(batches)
    saved = look.state_dict()  # the states before the fetch of the batch held ahead (batch 1)
    expected = next(batches)
    other = BatchLookAhead(True)
    other.load_state_dict(saved)
    assert rng_states_equal(other.state_dict(), saved)  # kept until the first fetch
    torch.rand(())  # the streams moved on since (the steps' draws)
    states = capture_rng_state()
    resumed = other.batches(_drawing_from(1, 1), resuming=True)
    assert next(resumed) == expected  # collated from the saved states: the same draw
    assert rng_states_equal(states, capture_rng_state())  # and the streams continue where they were
    assert list(resumed) == [] and other.state_dict() == {}
    again = other.batches(_drawing_from(1, 1), resuming=True)  # the loaded states serve the first call only
    assert next(again) != expected


def test_loaded_states_are_not_used_by_an_epoch_that_starts_at_its_beginning():
    look = BatchLookAhead(True)
    look.load_state_dict(capture_rng_state())
    torch.rand(())
    states = capture_rng_state()
    value = next(look.batches(_drawing(1)))
    restore_rng_state(states)
    assert value == torch.rand(()).item()  # drawn from the current streams, not the loaded ones
    look.load_state_dict({})
    assert look.state_dict() == {}


class DropoutClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out, self.drop = nn.Linear(4, 16), nn.Linear(16, 3), nn.Dropout(0.3)

    def forward(self, features: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, Any]:
        logits = self.out(self.drop(torch.relu(self.hidden(features))))
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


def stack(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A user's collator: stacks the batch, draws nothing."""
    return {key: torch.stack([item[key] for item in items]) for key in items[0]}


def augment(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A user's collator with random augmentation: noise from the global torch and python streams."""
    batch = stack(items)
    batch["features"] = batch["features"] + 0.1 * torch.randn_like(batch["features"]) * random.random()
    return batch


def _train(out: Any, collator: Any, resume: str | None = None) -> tuple[Trainer, nn.Module]:
    torch.manual_seed(0)
    model = DropoutClassifier()
    args = TrainingArguments(output_dir=str(out), per_device_train_batch_size=4, max_steps=20, save_steps=5,
                             logging_steps=1, learning_rate=1e-2, seed=3, disable_tqdm=True, report_to="none")
    trainer = Trainer(model=model, args=args, train_dataset=classification_data(48), data_collator=collator)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, model


@pytest.mark.parametrize("collator", [stack, augment], ids=["deterministic", "random-augmentation"])
@pytest.mark.parametrize("step", [5, 15])  # inside the watched fetches, and after them
def test_a_user_collator_resumes_exactly(tmp_path, collator, step):
    full, full_model = _train(tmp_path / "full", collator)
    checkpoint = tmp_path / "full" / f"checkpoint-{step}"
    held = read_rng_file(checkpoint / "rng_state.pth").get("trainwell_next_batch")
    if collator is stack and step > WATCHED_FETCHES:
        assert held is None  # watched, found deterministic: no states kept for the held batch
    else:
        assert held is not None
    resumed, resumed_model = _train(tmp_path / "resumed", collator, resume=str(checkpoint))
    for name, value in weights(full_model).items():
        assert torch.equal(weights(resumed_model)[name], value), name
    losses = [e["loss"] for e in full.state.log_history if "loss" in e and e["step"] > step]
    assert [e["loss"] for e in resumed.state.log_history if "loss" in e and e["step"] > step] == losses
