"""Model weight files: single/sharded safetensors, .bin, tied weights, validation errors, RNG state."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch import nn

from trainwell.checkpoint.layout import CheckpointError
from trainwell.checkpoint.rng import capture_rng_state, restore_rng_state, rng_file_name
from trainwell.checkpoint.weights import (
    load_model_weights,
    load_state_dict_from_folder,
    parse_size,
    save_model_weights,
)

torch.set_num_threads(1)


class Tied(nn.Module):
    def __init__(self, vocab: int = 7, dim: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mid = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied
        self.register_buffer("scale", torch.tensor([2.0]))


def _model(seed: int) -> Tied:
    torch.manual_seed(seed)
    return Tied()


def _index(folder) -> dict:
    return json.loads((folder / "model.safetensors.index.json").read_text())


def _assert_same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_parse_size():
    assert parse_size("5GB") == 5 * 10**9
    assert parse_size("500MB") == 500 * 10**6
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size(1234) == 1234
    with pytest.raises(ValueError, match="max_shard_size"):
        parse_size("lots")


def test_single_file_roundtrip_with_tied_weights(tmp_path):
    src, dst = _model(0), _model(1)
    files = save_model_weights(src, tmp_path)
    assert [f.name for f in files] == ["model.safetensors"]
    load_model_weights(dst, tmp_path)
    _assert_same(dst.state_dict(), src.state_dict())
    assert dst.head.weight is dst.embed.weight  # tie survives the load
    loaded = load_state_dict_from_folder(tmp_path)
    assert loaded["head.weight"] is loaded["embed.weight"]  # alias restored from the file metadata


def test_sharded_roundtrip_equals_state_dict(tmp_path):
    src, dst = _model(0), _model(1)
    save_model_weights(src, tmp_path, max_shard_size=40)
    index = _index(tmp_path)
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / "model.safetensors").exists()
    expected_total = sum(t.numel() * t.element_size() for k, t in src.state_dict().items() if k != "head.weight")
    assert index["metadata"]["total_size"] == expected_total
    _assert_same(load_state_dict_from_folder(tmp_path), src.state_dict())
    load_model_weights(dst, tmp_path)
    _assert_same(dst.state_dict(), src.state_dict())


def test_bin_format_and_stale_files_removed(tmp_path):
    src, dst = _model(0), _model(1)
    save_model_weights(src, tmp_path, max_shard_size=40)  # sharded safetensors first
    save_model_weights(src, tmp_path, safe_serialization=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pytorch_model.bin"]
    load_model_weights(dst, tmp_path)
    _assert_same(dst.state_dict(), src.state_dict())


def test_non_contiguous_tensor_is_saved(tmp_path):
    base = torch.arange(12.0).reshape(3, 4)
    save_model_weights({"t": base.t(), "row": base[1]}, tmp_path)
    loaded = load_state_dict_from_folder(tmp_path)
    torch.testing.assert_close(loaded["t"], base.t())
    torch.testing.assert_close(loaded["row"], base[1])


def test_truncated_file_raises_and_model_untouched(tmp_path):
    save_model_weights(_model(0), tmp_path)
    path = tmp_path / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 20])
    dst = _model(1)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"model\.safetensors: file is truncated"):
        load_model_weights(dst, tmp_path)
    _assert_same(dst.state_dict(), before)


def test_truncated_shard_names_the_shard(tmp_path):
    save_model_weights(_model(0), tmp_path, max_shard_size=40)
    name = _index(tmp_path)["weight_map"]["mid.weight"]
    shard = tmp_path / name
    shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.") + ": file is truncated"):
        load_model_weights(_model(1), tmp_path)


def test_missing_shard_and_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no model weights found"):
        load_model_weights(_model(1), tmp_path)
    save_model_weights(_model(0), tmp_path, max_shard_size=40)
    name = _index(tmp_path)["weight_map"]["embed.weight"]
    (tmp_path / name).unlink()
    with pytest.raises(CheckpointError, match=name.replace(".", r"\.") + ": weights file is missing"):
        load_model_weights(_model(1), tmp_path)


def test_missing_and_unexpected_keys(tmp_path):
    sd = _model(0).state_dict()
    del sd["mid.bias"]
    sd["extra.weight"] = torch.zeros(2)
    save_model_weights(sd, tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*missing keys \('mid\.bias'\).*unexpected keys \('extra\.weight'\)"):
        load_model_weights(_model(1), tmp_path)
    dst = _model(1)
    load_model_weights(dst, tmp_path, strict=False)  # loads what matches
    torch.testing.assert_close(dst.mid.weight, sd["mid.weight"])


def test_shape_mismatch_names_key_and_file(tmp_path):
    save_model_weights(Tied(vocab=9), tmp_path)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: key 'embed\.weight' has shape \(9, 4\).*\(7, 4\)"):
        load_model_weights(_model(1), tmp_path)


def test_tied_key_missing_from_foreign_file_is_filled(tmp_path):
    # Files written by other tools (transformers) drop the tied copy without recording an alias.
    sd = {k: v for k, v in _model(0).state_dict().items() if k != "head.weight"}
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "model.safetensors"))
    dst = _model(1)
    load_model_weights(dst, tmp_path)
    torch.testing.assert_close(dst.head.weight, sd["embed.weight"])


class PretrainedLike(nn.Linear):
    """Stands in for a transformers model: saves itself through save_pretrained."""

    def save_pretrained(self, folder, *, state_dict, safe_serialization):
        save_model_weights(dict(state_dict), folder, safe_serialization=safe_serialization)
        (folder / "config.json").write_text(json.dumps({"in": self.in_features}))


def test_model_with_save_pretrained_saves_itself(tmp_path):
    torch.manual_seed(0)
    src = PretrainedLike(2, 3)
    replacement = {k: torch.full_like(v, 0.5) for k, v in src.state_dict().items()}
    files = save_model_weights(src, tmp_path, state_dict=replacement)
    assert sorted(f.name for f in files) == ["config.json", "model.safetensors"]
    dst = PretrainedLike(2, 3)
    load_model_weights(dst, tmp_path)
    assert torch.equal(dst.weight, torch.full((3, 2), 0.5))


def test_rng_capture_restore_reproduces_draws():
    state = capture_rng_state()
    first = (random.random(), np.random.rand(), torch.rand(3), np.random.randn())
    restore_rng_state(state)
    second = (random.random(), np.random.rand(), torch.rand(3), np.random.randn())
    assert first[0] == second[0] and first[1] == second[1] and first[3] == second[3]
    torch.testing.assert_close(first[2], second[2], rtol=0, atol=0)
    assert rng_file_name(0, 1) == "rng_state.pth" and rng_file_name(3, 4) == "rng_state_3.pth"


def test_rng_file_roundtrip_with_safe_loading(tmp_path):
    from trainwell.checkpoint.rng import capture_rng_state, read_rng_file

    np.random.randn()  # leave a cached gaussian in numpy's state
    torch.save(capture_rng_state(), tmp_path / "rng_state.pth")  # as the checkpoint writes it
    expected = (random.random(), np.random.randn(), torch.rand(2))
    restore_rng_state(read_rng_file(tmp_path / "rng_state.pth"))
    assert (random.random(), np.random.randn()) == expected[:2]
    torch.testing.assert_close(torch.rand(2), expected[2], rtol=0, atol=0)
