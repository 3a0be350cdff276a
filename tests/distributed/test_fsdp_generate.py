"""``predict_with_generate`` on a model FSDP2 sharded (2 ranks, gloo) generates
what one process generates from the same weights. FSDP2 gathers the parameters around ``forward`` only; T5's
``generate`` runs its encoder directly, on sharded (DTensor) weights, unless ``generate`` is registered as a forward
method (``torch.distributed.fsdp.register_fsdp_forward_method``, as upstream's Trainer does for FSDP).

The file is both the test and the job (``python test_fsdp_generate.py OUT`` under torchrun): a tiny T5 trains two
steps under ``fsdp="full_shard"``, predicts with generate (the model still sharded) and saves its weights; the test
then predicts in one process from the saved weights and compares the generated ids.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TIMEOUT_S = 400
HERE = Path(__file__).resolve().parent


def _t5_and_data() -> tuple[Any, Any, Any]:
    sys.path.insert(0, str(HERE.parent / "trainer"))
    from test_seq2seq import _collate_for, _Seq2SeqData, _tiny_t5

    _, model = _tiny_t5()
    return model, _Seq2SeqData(), _collate_for(model)


def _args(out: Path, **kw: Any) -> Any:
    from trainwell import Seq2SeqTrainingArguments

    return Seq2SeqTrainingArguments(str(out), per_device_eval_batch_size=2, per_device_train_batch_size=2,
                                    predict_with_generate=True, generation_max_length=6, report_to="none",
                                    disable_tqdm=True, use_cpu=True, save_strategy="no", learning_rate=0.05,
                                    max_steps=2, seed=0, **kw)


def job(out: Path) -> None:
    from torch.distributed.fsdp import FSDPModule

    from jobs import finish
    from trainwell import Seq2SeqTrainer

    model, data, collate = _t5_and_data()
    trainer = Seq2SeqTrainer(model=model, args=_args(out / "run", fsdp="full_shard"), train_dataset=data,
                             data_collator=collate)
    trainer.train()
    sharded = isinstance(trainer.model, FSDPModule)
    predictions = trainer.predict(data).predictions
    trainer.save_model(str(out / "model"))
    finish(out / "results.json", {"sharded": sharded, "predictions": predictions.tolist()})


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    from helpers.launch import run_json, torchrun  # here: the job (this file) runs without tests/ on sys.path

    out = tmp_path_factory.mktemp("fsdp_generate")
    return run_json(torchrun(Path(__file__).resolve(), out), out / "results.json", "the 2-rank FSDP generate job",
                    timeout=TIMEOUT_S), out


def test_fsdp_generations_equal_one_process_with_the_same_weights(results, tmp_path) -> None:
    from trainwell import Seq2SeqTrainer

    got, out = results
    assert got["sharded"] is True  # generate ran on the FSDP2-sharded model
    model, data, collate = _t5_and_data()
    model = type(model).from_pretrained(out / "model")
    single = Seq2SeqTrainer(model=model, args=_args(tmp_path), data_collator=collate).predict(data).predictions
    assert single.shape == (7, 20)
    assert (single[:, 1:] != 0).any()  # something was generated
    np.testing.assert_array_equal(np.array(got["predictions"]), single)


if __name__ == "__main__":
    job(Path(sys.argv[1]))
