"""OutputAccumulator (trainwell.loops.accumulate) on its own: padding, nesting, flushing, truncation, no outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainwell.loops.accumulate import PAD_INDEX, OutputAccumulator


class OnAccelerator(torch.Tensor):
    """A CPU tensor that reports an accelerator device, so the accumulator's device path (pieces kept until a
    flush, as on a GPU) runs on a CPU-only machine; its data is ordinary CPU memory."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", 0)


def on_accelerator(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.as_subclass(OnAccelerator)


def batches(lengths=(3, 5, 2), rows=(2, 2, 1)) -> list[torch.Tensor]:
    """Token-level outputs of uneven sequence lengths, values 1000*batch + 10*row + position (all distinct)."""
    return [torch.tensor([[1000 * b + 10 * r + p for p in range(length)] for r in range(n)], dtype=torch.float32)
            for b, (length, n) in enumerate(zip(lengths, rows))]


def collect(pieces, *, flush_every: int | None = None, concat: bool = True):
    acc = OutputAccumulator(concat=concat)
    for step, piece in enumerate(pieces, start=1):
        acc.add(piece)
        if flush_every and step % flush_every == 0:
            acc.flush()
    return acc.result()


def test_uneven_lengths_are_padded_on_the_right_with_minus_100():
    out = collect(batches())
    assert out.shape == (5, 5) and out.dtype == np.float32
    np.testing.assert_array_equal(out[0], [0, 1, 2, PAD_INDEX, PAD_INDEX])
    np.testing.assert_array_equal(out[3], [1010, 1011, 1012, 1013, 1014])
    np.testing.assert_array_equal(out[4], [2000, 2001, PAD_INDEX, PAD_INDEX, PAD_INDEX])
    integer = collect([torch.ones(1, 2, dtype=torch.uint8), torch.ones(1, 3, dtype=torch.uint8)])
    assert integer.dtype == np.int64 and integer.tolist() == [[1, 1, -100], [1, 1, 1]]  # -100 fits


def test_nested_tuples_and_dicts_keep_their_structure():
    pieces = [(t, {"hidden": t * 2, "pair": (t.sum(dim=1), t[:, :1])}) for t in batches()]
    out = collect(pieces)
    plain = collect(batches())
    assert isinstance(out, tuple) and set(out[1]) == {"hidden", "pair"} and isinstance(out[1]["pair"], tuple)
    np.testing.assert_array_equal(out[0], plain)
    np.testing.assert_array_equal(out[1]["hidden"][:, :2], plain[:, :2] * 2)
    np.testing.assert_array_equal(out[1]["pair"][0], np.concatenate([t.sum(dim=1).numpy() for t in batches()]))
    assert out[1]["pair"][1].shape == (5, 1)


@pytest.mark.parametrize("flush_every", [1, 2, 3])
def test_flushing_every_k_steps_gives_the_arrays_of_never_flushing(flush_every):
    pieces = [(on_accelerator(t), {"sum": on_accelerator(t.sum(dim=1))}) for t in batches((3, 5, 2, 4), (2, 2, 1, 3))]
    acc = OutputAccumulator()
    acc.add(pieces[0])
    assert acc.pending == 1  # kept on the "device" until a flush, as eval_accumulation_steps expects
    acc.flush()
    assert acc.pending == 0
    reference = collect([(t, {"sum": t.sum(dim=1)}) for t in batches((3, 5, 2, 4), (2, 2, 1, 3))])
    never = collect(pieces)
    flushed = collect(pieces, flush_every=flush_every)
    for out in (never, flushed):
        np.testing.assert_array_equal(out[0], reference[0])
        np.testing.assert_array_equal(out[1]["sum"], reference[1]["sum"])


def test_the_last_short_batch_and_every_row_are_kept():
    full, short = torch.arange(12.0).reshape(4, 3), torch.arange(100.0, 106.0).reshape(2, 3)
    out = collect([full, full + 12, short])
    assert out.shape == (10, 3)
    np.testing.assert_array_equal(out[8:], short.numpy())
    # without concatenation (eval_do_concat_batches=False) the batches stay separate, whole
    separate = collect([full, full + 12, short], concat=False)
    assert [b.shape for b in separate] == [(4, 3), (4, 3), (2, 3)]
    np.testing.assert_array_equal(separate[2], short.numpy())


def test_no_labels_gives_none():
    acc = OutputAccumulator()
    for _ in range(3):
        acc.add(None)  # what the loop adds for a batch without labels
    acc.flush()
    assert acc.result() is None
    assert OutputAccumulator(concat=False).result() is None


def test_an_output_present_in_some_batches_only_is_a_clear_error():
    with pytest.raises(ValueError, match="None for some batches"):
        collect([(torch.ones(2, 2), torch.ones(2)), (torch.ones(2, 2), None)])
    with pytest.raises(ValueError, match="changed structure"):
        collect([(torch.ones(2, 2),), (torch.ones(2, 2), torch.ones(2))])


def test_bfloat16_becomes_float32():
    out = collect([torch.ones(2, 2, dtype=torch.bfloat16), on_accelerator(torch.ones(1, 2, dtype=torch.bfloat16))])
    assert out.dtype == np.float32 and out.tolist() == [[1, 1]] * 3
