"""Peak host memory of ``save_model`` for a sharded model, 2 ranks (gloo, CPU): run by
``tests/distributed/test_save_memory.py`` and ``bench/save_memory.py``.

Usage: ``torchrun --nproc_per_node=2 save_memory_job.py RESULT WORK LAYERS WIDTH SCENARIO...`` with scenarios
``zero3`` (stage3_gather_16bit_weights_on_model_save true), ``zero3_nogather`` (false) and ``fsdp``. For each, every
rank samples its resident memory (``/proc/self/statm``, every millisecond) during ``save_model`` and during a whole
gather (``backend.full_state_dict()``, what a save did before streaming), above the resident memory just before;
rank 0 writes those peaks, the model's size and what the saved folder holds. Run it with
``MALLOC_MMAP_THRESHOLD_`` set, so freed tensors go back to the system and resident memory follows live memory.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch
from torch import nn

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jobs import finish  # noqa: E402
from trainwell import Trainer, TrainingArguments  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
PAGE = os.sysconf("SC_PAGE_SIZE")


class Deep(nn.Module):
    """``layers`` square linear layers: the model size grows with the number of layers, one layer stays small."""

    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return {"loss": nn.functional.mse_loss(x.mean(-1), labels), "logits": x}


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE


def peak_above_start(work) -> tuple[int, object]:
    """``(peak resident bytes above the start, work())`` sampled every millisecond while ``work`` runs."""
    start, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        result = work()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _rss()) - start, result


def zero3(gather: bool) -> dict:
    return {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto", "steps_per_print": 10 ** 9,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                  "stage3_gather_16bit_weights_on_model_save": gather}}


def scenario(work: Path, name: str, layers: int, width: int) -> dict:
    options = {"zero3": {"deepspeed": zero3(True)}, "zero3_nogather": {"deepspeed": zero3(False)},
               "fsdp": {"fsdp": "full_shard"}}[name]
    torch.manual_seed(0)
    data = [{"x": torch.randn(width), "labels": torch.randn(())} for _ in range(4)]
    args = TrainingArguments(output_dir=str(work / name), use_cpu=True, per_device_train_batch_size=2, max_steps=1,
                             learning_rate=0.01, save_strategy="no", report_to="none", disable_tqdm=True,
                             ddp_backend="gloo", **options)
    trainer = Trainer(model=Deep(layers, width), args=args, train_dataset=data)
    trainer.train()
    out = work / name / "final"
    save_peak, _ = peak_above_start(lambda: trainer.save_model(str(out)))
    gather_peak, full = peak_above_start(trainer.backend.full_state_dict)
    model_bytes = sum(t.numel() * t.element_size() for t in full.values())
    layer_bytes = (width * width + width) * 4
    result = {"save_peak": save_peak, "gather_peak": gather_peak, "model_bytes": model_bytes,
              "layer_bytes": layer_bytes, "files": sorted(p.name for p in out.iterdir())}
    if RANK == 0 and (out / "model.safetensors").is_file():
        from safetensors.torch import load_file

        saved = load_file(str(out / "model.safetensors"))
        result["equal_to_gathered"] = set(saved) == set(full) and all(torch.equal(saved[k], full[k]) for k in full)
    peaks = [None, None]
    torch.distributed.all_gather_object(peaks, (save_peak, gather_peak))
    result["peaks_by_rank"] = peaks
    del full
    return result


def main() -> None:
    result_path, work = Path(sys.argv[1]), Path(sys.argv[2])
    layers, width = int(sys.argv[3]), int(sys.argv[4])
    results = {name: scenario(work, name, layers, width) for name in sys.argv[5:]}
    finish(result_path, results)


if __name__ == "__main__":
    main()
