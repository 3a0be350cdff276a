"""Elastic resume: a checkpoint written by 2 processes resumes on 1, and one written by 1 resumes on 2, with the same
global batch (``gradient_accumulation_steps`` scaled), ending within float noise of the uninterrupted run.

Per backend, ``elastic_job.py`` trains 12 steps from scratch on 2 ranks (``a2``) and on 1 (``a1``; the ground truth
that both sizes train the same model, up to the order of the reductions), then resumes ``a2``'s ``checkpoint-6`` on 1
process (``r21``) and ``a1``'s on 2 (``r12``): the final weights must equal those of the uninterrupted run of the
checkpoint's size; DDP resumes FSDP2's sharded checkpoint the same way. Before the fix FSDP2 2 -> 1 resumed with a fresh optimizer (7e-2 off), FSDP2 1 -> 2 and ZeRO 2 -> 1
were refused. A DeepSpeed checkpoint resumed without DeepSpeed, and an FSDP one with DeepSpeed, are refused before
anything is loaded, with a message naming what differs and the way out.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from helpers.launch import child_env, run, torchrun
from helpers.tensors import final_weights

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.deepspeed]

JOB = Path(__file__).with_name("elastic_job.py")
TIMEOUT_S = 400
# the runs of each launch, in order: (processes, [RUN, ...]) (see elastic_job.py)
LAUNCHES = {
    "fsdp": [(2, ["a2"]), (1, ["a1", "r21=fsdp/a2/checkpoint-6"]), (2, ["r12=fsdp/a1/checkpoint-6"])],
    "zero2": [(2, ["a2"]), (1, ["a1", "r21=zero2/a2/checkpoint-6"]),
              (2, ["r12=zero2/a1/checkpoint-6", "refused=fsdp/a2/checkpoint-6"])],
    "zero3": [(2, ["a2"]), (1, ["a1", "r21=zero3/a2/checkpoint-6"]), (2, ["r12=zero3/a1/checkpoint-6"])],
    # DDP on 2 ranks resumes FSDP2's sharded checkpoint (every rank reads fsdp_state/ whole through DCP)
    "ddp": [(2, ["from_fsdp=fsdp/a2/checkpoint-6"])],
}
FLOAT_NOISE = 1e-6  # measured: 6e-8 to 1.2e-7 on every backend and direction


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every launch of every backend (FSDP's first: ZeRO-2's last launch resumes an FSDP checkpoint)."""
    root = tmp_path_factory.mktemp("elastic")
    for backend, launches in LAUNCHES.items():
        if backend.startswith("zero") and not _has_deepspeed():
            continue
        for i, (nproc, runs) in enumerate(launches):
            done = run(torchrun(JOB, root, backend, *runs, nproc=nproc), f"{backend} launch {i} ({nproc} proc)",
                       timeout=TIMEOUT_S, env=child_env(DS_ACCELERATOR="cpu"))
            log = done.stdout
            (root / f"{backend}-{i}.log").write_text(log)
            # never a silent fresh optimizer, lost RNG streams or a data position said to be inexact
            for phrase in ("start fresh", "starts fresh", "not restored", "exact data position cannot"):
                assert phrase not in log, f"{backend} launch {i}: {phrase!r}\n{log[-4000:]}"
    return root


def _has_deepspeed() -> bool:
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        return False
    return True


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=FLOAT_NOISE, msg=name)


CASES = [("fsdp", "r21", "a2"), ("fsdp", "r12", "a1"), ("zero2", "r21", "a2"), ("zero2", "r12", "a1"),
         ("zero3", "r21", "a2"), ("zero3", "r12", "a1")]


@pytest.mark.parametrize(("backend", "resumed", "uninterrupted"), CASES)
def test_resized_resume_ends_on_the_uninterrupted_weights(root, backend, resumed, uninterrupted):
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    out = root / backend
    want = final_weights(out / uninterrupted)
    if (out / "a1").is_dir() and (out / "a2").is_dir():  # ground truth: both sizes train the same model
        _assert_close(final_weights(out / "a1"), final_weights(out / "a2"))
    # the resumed run really ran on the other size, to the end
    import json

    world = json.loads((out / resumed / "result.json").read_text())["world_size"]
    assert world == (1 if resumed == "r21" else 2)
    assert json.loads((out / resumed / "result.json").read_text())["global_step"] == 12
    _assert_close(final_weights(out / resumed), want)
    assert not [p.name for p in out.rglob(".tmp-universal-*")]  # the DeepSpeed conversion is removed


def test_ddp_resumes_a_sharded_fsdp_checkpoint(root):
    """FSDP2 and DDP train the same model with the same optimizer: DDP reads FSDP's shards whole and ends on the
    weights of the uninterrupted FSDP2 run."""
    import json

    assert json.loads((root / "ddp" / "from_fsdp" / "result.json").read_text()) == {"global_step": 12, "world_size": 2}
    _assert_close(final_weights(root / "ddp" / "from_fsdp"), final_weights(root / "fsdp" / "a2"))


def test_a_checkpoint_of_fsdp_is_refused_by_deepspeed(root):
    pytest.importorskip("deepspeed")
    message = (root / "zero2" / "refused" / "error.txt").read_text()
    assert "written without DeepSpeed" in message and "fsdp_state" in message
    assert "Resume without `deepspeed`" in message and "resume_from_checkpoint=None" in message
    assert not (root / "zero2" / "refused" / "final.safetensors").exists()


def test_a_deepspeed_checkpoint_is_refused_without_deepspeed(root, tmp_path):
    """One process, no DeepSpeed, the 2-rank ZeRO-2 checkpoint: refused before training, naming DeepSpeed, the
    number of processes that wrote it and both ways out; the checkpoint is left as it was."""
    pytest.importorskip("deepspeed")
    from elastic_job import Net, make_data

    from trainwell import Trainer, TrainingArguments

    checkpoint = root / "zero2" / "a2" / "checkpoint-6"
    before = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*"))
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, num_train_epochs=2, report_to="none", disable_tqdm=True)
    trainer = Trainer(model=Net(), args=args, train_dataset=make_data())
    with pytest.raises(ValueError) as caught:
        trainer.train(resume_from_checkpoint=str(checkpoint))
    message = str(caught.value)
    assert "written by DeepSpeed (2 process(es))" in message and "trains without DeepSpeed" in message
    assert "same `deepspeed` config" in message and "trainwell zero-to-fp32" in message
    assert trainer.state.global_step == 0
    assert sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*")) == before
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
