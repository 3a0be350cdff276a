"""A stream (an ``IterableDataset``) resumed from a checkpoint: from its saved position when it has one
(``state_dict``/``load_state_dict``: a ``datasets`` streaming dataset, a user's iterable), else by re-reading the
consumed batches; either way the resumed run trains exactly what the uninterrupted run trains."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from helpers.callbacks import StopAtStep
from helpers.models import RegressionModel
from helpers.tensors import weights

BATCH, STEPS, SAVE_AT = 3, 8, 4


def example(i: int) -> dict[str, Any]:
    """The i-th example of every stream here (a deterministic function of i)."""
    return {"x": [float(i % 7) / 7.0, 1.0], "labels": float((i * 3) % 5) / 5.0}


class CountingStream(torch.utils.data.IterableDataset):
    """A user's stream that can say its position: ``produced`` lists every example index it read."""

    def __init__(self, n: int = 100, *, stateful: bool = True) -> None:
        self.n, self.next_index, self.produced = n, 0, []
        if not stateful:
            self.state_dict = None  # type: ignore[assignment]

    def __iter__(self):
        while self.next_index < self.n:
            i = self.next_index
            self.next_index += 1
            self.produced.append(i)
            yield {k: torch.tensor(v) for k, v in example(i).items()}

    def state_dict(self) -> dict[str, int]:
        """The index of the next example."""
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at the saved index."""
        self.next_index = state["next_index"]


class Calls:
    """The shards a ``datasets`` generator opened, in order (not a list: ``gen_kwargs`` lists are shards)."""

    def __init__(self) -> None:
        self.opened: list[int] = []


def _shards(shards: list[int], calls: Calls):
    for shard in shards:
        calls.opened.append(shard)
        for j in range(4):
            yield example(shard * 4 + j)


def hf_stream(calls: Calls, *, buffer: int | None = None) -> Any:
    """A ``datasets`` streaming dataset of 12 shards of 4 examples (``calls``: the shards its generator opened)."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.IterableDataset.from_generator(_shards, gen_kwargs={"shards": list(range(12)), "calls": calls})
    return ds.shuffle(seed=3, buffer_size=buffer) if buffer else ds


def _train(make_args, out: Path, dataset: Any, *, stop: int | None = None, resume: str | None = None,
           **overrides: Any) -> dict[str, torch.Tensor]:
    from trainwell import Trainer

    torch.manual_seed(0)
    model = RegressionModel()
    args = make_args(output_dir=str(out), max_steps=STEPS, per_device_train_batch_size=BATCH, save_strategy="steps",
                     save_steps=SAVE_AT, remove_unused_columns=False, **overrides)
    trainer = Trainer(model=model, args=args, train_dataset=dataset,
                      callbacks=[StopAtStep(stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return weights(model)


def _interrupted(make_args, tmp_path: Path, make_dataset, caplog, **overrides: Any) -> tuple[dict, Any, str]:
    """Train to SAVE_AT and stop; resume from the checkpoint on a fresh dataset: (weights, that dataset, the log)."""
    _train(make_args, tmp_path / "cut", make_dataset(), stop=SAVE_AT, **overrides)
    resumed_dataset = make_dataset()
    with caplog.at_level(logging.INFO, logger="trainwell"):
        final = _train(make_args, tmp_path / "cut", resumed_dataset,
                       resume=str(tmp_path / "cut" / f"checkpoint-{SAVE_AT}"), **overrides)
    return final, resumed_dataset, caplog.text


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stateful_stream_resumes_from_its_position_without_rereading(make_args, tmp_path, caplog):
    whole = _train(make_args, tmp_path / "whole", CountingStream())
    final, resumed, log = _interrupted(make_args, tmp_path, CountingStream, caplog)
    assert _equal(final, whole)
    assert "resuming the stream from its saved position" in log
    # not one consumed example read again: the look-ahead's batch too was not consumed, so it is read now
    assert resumed.produced[0] == SAVE_AT * BATCH


def test_stream_without_state_is_reread_and_says_how_many(make_args, tmp_path, caplog):
    def make() -> CountingStream:
        return CountingStream(stateful=False)

    whole = _train(make_args, tmp_path / "whole", make())
    final, resumed, log = _interrupted(make_args, tmp_path, make, caplog)
    assert _equal(final, whole)
    assert f"re-reading {SAVE_AT} batches to reach the position (the dataset has no state_dict" in log
    assert resumed.produced[0] == 0


def test_datasets_stream_resumes_from_its_position(make_args, tmp_path, caplog):
    whole = _train(make_args, tmp_path / "whole", hf_stream(Calls()))
    calls: list[Calls] = []

    def make() -> Any:
        calls.append(Calls())
        return hf_stream(calls[-1])

    final, _, log = _interrupted(make_args, tmp_path, make, caplog)
    assert _equal(final, whole)
    assert "resuming the stream from its saved position" in log
    # 12 examples consumed = shards 0-2 (4 each), and the batch fetched ahead read into shard 3; the resumed stream
    # opens only shard 2, where its saved position stood (datasets then skips its 4 consumed examples unyielded),
    # and goes on from shard 3: shards 0 and 1 are never read again
    interrupted, resumed = calls
    assert interrupted.opened[:4] == [0, 1, 2, 3]
    assert resumed.opened[:3] == [2, 3, 4], resumed.opened


def test_datasets_shuffle_buffer_falls_back_to_the_exact_reread(make_args, tmp_path, caplog):
    whole = _train(make_args, tmp_path / "whole", hf_stream(Calls(), buffer=5))
    final, _, log = _interrupted(make_args, tmp_path, lambda: hf_stream(Calls(), buffer=5), caplog)
    assert _equal(final, whole)
    assert f"re-reading {SAVE_AT} batches" in log and "shuffle buffer" in log


def test_ignore_data_skip_neither_skips_nor_restores(make_args, tmp_path, caplog):
    final, resumed, log = _interrupted(make_args, tmp_path, CountingStream, caplog, ignore_data_skip=True)
    assert resumed.produced[0] == 0 and "resuming the stream" not in log and "re-reading" not in log


def test_stream_position_is_saved_per_rank_in_the_checkpoint(make_args, tmp_path):
    _train(make_args, tmp_path / "cut", CountingStream(), stop=SAVE_AT)
    folder = tmp_path / "cut" / f"checkpoint-{SAVE_AT}"
    from trainwell.checkpoint.rng import read_rng_file

    saved = read_rng_file(folder / "rng_state.pth")["trainwell_stream"]
    # the state after the last consumed batch, not after the batch the loader fetched ahead
    assert saved == {"state": {"next_index": SAVE_AT * BATCH}, "world_size": 1}
    assert "rng_state.pth" in (folder / ".complete").read_text()


def test_another_number_of_ranks_warns_and_rereads(caplog):
    from trainwell.data.stream_state import StreamPosition

    stream = CountingStream()
    position = StreamPosition(stream, world_size=4)
    position.load_state_dict({"state": {"next_index": 30}, "world_size": 2})
    with caplog.at_level(logging.INFO, logger="trainwell"):
        assert position.restore(5) is False
    assert stream.next_index == 0
    warning = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning and "saved by 2 processes and 4 train now" in warning[0].getMessage()
    assert "re-reading 5 batches to reach the position" in caplog.text


def test_worker_processes_keep_the_reread_and_say_why(caplog):
    from trainwell.data.stream_state import StreamPosition

    loader = SimpleNamespace(dataset=CountingStream())  # what StreamPosition reads of a DataLoader (no process)
    loader.num_workers = 1
    position = StreamPosition.of(loader, world_size=1)
    assert not position.followed
    with caplog.at_level(logging.INFO, logger="trainwell"):
        assert position.restore(3) is False
    assert "re-reading 3 batches to reach the position (dataloader_num_workers > 0" in caplog.text


def test_a_stream_with_a_length_counts_on_from_its_restored_position():
    from trainwell.data.length_check import LengthCheckedIterable

    class Sized(CountingStream):
        def __len__(self) -> int:
            return self.n

    stream = Sized(10)
    checked = LengthCheckedIterable(stream, "train")
    stream.load_state_dict({"next_index": 4})
    checked.resume_count(4)
    assert len(list(checked)) == 6  # and no error: 4 + 6 == __len__


@pytest.mark.slow
def test_worker_processes_resume_from_the_position_torchdata_collects(make_args, tmp_path, caplog):
    """With ``dataloader_num_workers=1`` and torchdata installed (``trainwell[stream]``), the loader is torchdata's
    ``StatefulDataLoader``: its state (the worker's stream position) is saved and restored, exactly."""
    import signal

    pytest.importorskip("torchdata", reason="pip install 'trainwell[stream]' (torchdata)")
    # torchdata's loader installs its own SIGCHLD handler once per process (as torch's own loader does), and keeps it
    handler = signal.getsignal(signal.SIGCHLD)
    try:
        whole = _train(make_args, tmp_path / "whole", CountingStream(), dataloader_num_workers=1)
        final, _, log = _interrupted(make_args, tmp_path, CountingStream, caplog, dataloader_num_workers=1)
    finally:
        signal.signal(signal.SIGCHLD, handler)
    assert _equal(final, whole)
    assert "resuming the stream from its saved position" in log and "re-reading" not in log


def test_the_reread_shows_a_progress_bar(capsys):
    from trainwell.data.stream_state import StreamPosition
    from trainwell.loops.train_loop import _epoch_iterator

    loader = torch.utils.data.DataLoader(CountingStream(stateful=False), batch_size=BATCH)
    position = StreamPosition.of(loader, world_size=1)
    first = next(_epoch_iterator(0, loader, 0, 3, stream=position, progress=True))
    assert torch.equal(first["labels"], torch.tensor([example(i)["labels"] for i in range(9, 12)]))
    assert "Re-reading the consumed batches" in capsys.readouterr().err
