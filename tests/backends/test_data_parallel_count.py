"""``num_items_in_batch`` under ``nn.DataParallel`` (several GPUs in one process), as upstream 5.x prepares it
(``Trainer._get_num_items_in_batch``) and scales the loss (``compute_loss``). DataParallel needs GPUs, so its scatter
(``chunk`` along dim 0) and gather (concatenation, then ``training_step``'s mean) are emulated here."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainwell import Trainer, TrainingArguments
from trainwell.loops.loss_scaling import average_tokens_loss_scale, data_parallel_num_items


def test_a_zero_dim_count_becomes_one_row_per_gpu() -> None:
    count = torch.tensor(10)
    shared = data_parallel_num_items(count, 2, average_tokens_across_devices=True)
    assert shared.shape == (2, 1) and shared.tolist() == [[10], [10]]
    split = data_parallel_num_items(count, 2, average_tokens_across_devices=False)  # upstream's count // n_gpu
    assert split.shape == (2, 1) and split.tolist() == [[5], [5]]
    assert data_parallel_num_items(10, 4, average_tokens_across_devices=False) == 2  # an int is replicated as it is


def test_loss_scale_is_upstreams() -> None:
    assert average_tokens_loss_scale(1, 2) == 2  # DataParallel: the replicas
    assert average_tokens_loss_scale(4, 1) == 4 and average_tokens_loss_scale(4, 0) == 4  # DDP: the processes


@pytest.mark.parametrize("average", [True, False])
def test_emulated_data_parallel_loss_is_the_whole_batch_sum_over_its_items(average: bool) -> None:
    per_item = torch.arange(1.0, 9.0)  # 8 items, 4 per replica
    n_gpu, whole = 2, per_item.sum() / 8
    counts = data_parallel_num_items(torch.tensor(8), n_gpu, average_tokens_across_devices=average)
    replicas = [part.sum() / count for part, count in zip(per_item.chunk(n_gpu), counts.chunk(n_gpu))]  # scatter
    gathered = torch.cat([r.reshape(-1) for r in replicas])
    if average:  # compute_loss: loss *= n_gpu (upstream: loss_scale if n_gpu <= 1 else n_gpu)
        gathered = gathered * average_tokens_loss_scale(1, n_gpu)
    assert gathered.mean().item() == pytest.approx(whole.item())  # training_step: loss.mean()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x, labels=None, num_items_in_batch=None):
        return {"loss": ((self.lin(x).squeeze(-1) - labels) ** 2).sum() / num_items_in_batch}


def test_training_step_hands_compute_loss_the_per_gpu_count_and_scales_the_loss(tmp_path) -> None:
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
                             average_tokens_across_devices=True)
    trainer = Trainer(model=Net(), args=args)
    trainer._tw_n_gpu = 2  # as with 2 GPUs (the model is not wrapped: DataParallel needs them)
    seen = []
    original = trainer.compute_loss

    def compute_loss(model, inputs, return_outputs=False, num_items_in_batch=None):
        seen.append(num_items_in_batch)
        return original(model, inputs, return_outputs, num_items_in_batch)

    trainer.compute_loss = compute_loss
    inputs = {"x": torch.randn(4, 2), "labels": torch.randn(4)}
    with torch.no_grad():
        plain = ((trainer.model.lin(inputs["x"]).squeeze(-1) - inputs["labels"]) ** 2).sum() / 4
    loss = trainer.training_step(trainer.model, dict(inputs), num_items_in_batch=torch.tensor(4))
    assert seen[0].shape == (2, 1)
    assert loss.item() == pytest.approx(2 * plain.item(), rel=1e-6)  # loss * n_gpu (one replica saw the whole batch)
