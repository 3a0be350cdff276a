"""A sharded model's save keeps about one layer in host memory, not the model (ZeRO-3 and FSDP2, 2 gloo ranks).

The job (``save_memory_job.py``) saves a 48-layer model (48 x 1 MiB) and samples each rank's resident memory during
``save_model`` and during a whole gather (what every save did before: the full model on every rank). ZeRO-3 with
``stage3_gather_16bit_weights_on_model_save: false`` writes the engine checkpoint instead (seed 001).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.launch import child_env, run_json, torchrun

pytestmark = pytest.mark.deepspeed

JOB = Path(__file__).with_name("save_memory_job.py")
LAYERS, WIDTH = 48, 512


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    pytest.importorskip("deepspeed")
    work = tmp_path_factory.mktemp("save_memory")
    out = work / "results.json"
    # a fixed mmap threshold: freed tensors go back to the system, so resident memory follows live memory
    env = child_env(DS_ACCELERATOR="cpu", MALLOC_MMAP_THRESHOLD_="131072")
    return run_json(torchrun(JOB, out, work, LAYERS, WIDTH, "zero3", "zero3_nogather", "fsdp"), out,
                    "the 2-rank save-memory job", timeout=600, env=env)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", ["zero3", "fsdp"])
def test_save_peak_memory_is_a_few_layers_not_the_model(results, name):
    part = results[name]
    model, layer = part["model_bytes"], part["layer_bytes"]
    assert model == LAYERS * layer
    assert "model.safetensors" in part["files"] and part["equal_to_gathered"]
    assert part["peaks_by_rank"][0][1] >= 0.9 * model  # the measurement sees the writer's whole gather ...
    if name == "zero3":  # (a whole ZeRO-3 gather, as every save did before, holds the model on every rank)
        assert part["peaks_by_rank"][1][1] >= 0.9 * model
    for save_peak, _ in part["peaks_by_rank"]:
        assert save_peak <= 6 * layer, (save_peak, layer, model)  # ... and a streamed save holds a few layers


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_without_gather_on_save_writes_the_engine_checkpoint(results):
    part = results["zero3_nogather"]
    assert "model.safetensors" not in part["files"] and "latest" in part["files"]
    assert any(name.startswith("global_step") for name in part["files"]) and "zero_to_fp32.py" in part["files"]
    for save_peak, _ in part["peaks_by_rank"]:
        assert save_peak <= 6 * part["layer_bytes"]  # nothing gathered: each rank writes its own shards
