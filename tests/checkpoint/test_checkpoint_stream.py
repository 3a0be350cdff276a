"""Weights written tensor by tensor (trainwell/checkpoint/stream.py): the file equals safetensors' own, tied weights
are written once, shards and index as for a whole state dict, and a writer's error still walks the whole stream."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from trainwell.checkpoint.stream import StreamedWeights, tensor_stream
from trainwell.checkpoint.weights import load_model_weights, save_model_weights


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 5)
        self.mid = nn.Linear(5, 5).to(torch.bfloat16)
        self.head = nn.Linear(5, 7, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.arange(3))


def _parts(path) -> tuple[dict, bytes]:
    """A safetensors file's header (parsed: safetensors orders the metadata keys of a file at random) and data."""
    import json
    import struct

    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + size]), data[8 + size:]


def _stream(model: nn.Module, taken: list[str] | None = None) -> StreamedWeights:
    def gather(obj):
        if taken is not None:
            taken.append(obj)
        return obj.detach().to("cpu", copy=True)

    return tensor_stream(iter(model.state_dict(keep_vars=True).items()), gather, lambda obj: obj.shape)


def test_streamed_file_holds_every_tensor_once_and_loads_back(tmp_path):
    torch.manual_seed(0)
    model = Tied()
    taken: list = []
    save_model_weights(model, tmp_path, state_dict=_stream(model, taken))
    assert len(taken) == 4  # embed (= head), mid.weight, mid.bias, steps: the tied weight is gathered once
    on_disk = load_file(str(tmp_path / "model.safetensors"))
    save_model_weights(model, tmp_path / "whole")  # safetensors' own writer: the same header and bytes
    assert _parts(tmp_path / "model.safetensors") == _parts(tmp_path / "whole" / "model.safetensors")
    assert set(on_disk) == {"embed.weight", "mid.weight", "mid.bias", "steps"}
    assert on_disk["mid.weight"].dtype == torch.bfloat16
    for name, value in model.state_dict().items():
        if name in on_disk:
            assert torch.equal(on_disk[name], value), name
    fresh = Tied()
    load_model_weights(fresh, tmp_path)  # the alias head.weight is restored from the metadata
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name


def test_streamed_shards_and_index_match_a_whole_state_dict_save(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    save_model_weights(model, tmp_path / "streamed", state_dict=_stream(model), max_shard_size=2500)
    save_model_weights(model, tmp_path / "whole", max_shard_size=2500)
    names = sorted(p.name for p in (tmp_path / "whole").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "streamed").iterdir()) and len(names) > 2
    fresh = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    load_model_weights(fresh, tmp_path / "streamed")
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_a_writer_error_still_walks_the_whole_stream(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    taken: list = []
    stream = _stream(model, taken)
    stream.entries[1] = type(stream.entries[1])("0.bias", torch.float32, (99,))  # a description that lies
    with pytest.raises(RuntimeError, match=r"0\.bias: the gathered tensor does not match"):
        save_model_weights(model, tmp_path, state_dict=stream)
    assert len(taken) == 4  # the other ranks' gathers stay matched
    assert not (tmp_path / "model.safetensors").exists()
