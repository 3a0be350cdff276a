"""One process, no launcher: the seeds' notebook emulation (RANK=0, WORLD_SIZE=1, MASTER_ADDR...) with DeepSpeed.

Trains the same 4 steps without DeepSpeed, with ZeRO-2 and with ZeRO-3, and prints each loss curve as JSON.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.update(MASTER_ADDR="localhost", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", DS_ACCELERATOR="cpu")
sys.path.insert(0, os.path.dirname(__file__))

from deepspeed_job import MLP, make_data, zero

from trainwell import Trainer, TrainingArguments, set_seed

curves = {}
for name, config in (("plain", None), ("zero2", zero(2)), ("zero3", zero(3))):
    set_seed(0)
    args = TrainingArguments(output_dir=os.path.join(sys.argv[1], name), use_cpu=True, per_device_train_batch_size=8,
                             max_steps=4, seed=0, learning_rate=0.05, logging_steps=1, save_strategy="no",
                             report_to="none", disable_tqdm=True, deepspeed=config)
    trainer = Trainer(model=MLP(), args=args, train_dataset=make_data())
    trainer.train()
    curves[name] = {"backend": type(trainer.backend).__name__,
                    "curve": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]}
print("CURVES " + json.dumps(curves), flush=True)
os._exit(0)  # DeepSpeed's CPU communication threads may abort the interpreter's teardown
