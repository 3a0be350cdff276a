"""With ``predict_with_generate`` under bf16, the generation steps run in the
same autocast as the loss forward and hand float32 logits to the logits processors, as upstream's (its generate calls
the prepared forward, which accelerate wrapped in autocast and ``convert_outputs_to_fp32``). Both libraries run the
same tiny T5 on the CPU; the dtypes seen inside generate and the generated ids are compared."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from test_seq2seq import _collate_for, _Seq2SeqData, _tiny_t5

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


class RecordingProcessor(transformers.LogitsProcessor):
    def __init__(self) -> None:
        self.dtypes: list[str] = []

    def __call__(self, input_ids, scores):
        self.dtypes.append(str(scores.dtype))
        return scores


def _generate(lib, model, tmp_path, **opts) -> tuple[list[bool], set[str], set[str], np.ndarray]:
    model = copy.deepcopy(model)
    autocast: list[bool] = []
    head: list[str] = []

    def record(module, args, output):
        autocast.append(torch.is_autocast_enabled("cpu"))
        head.append(str(output.dtype))

    model.lm_head.register_forward_hook(record)
    args = lib.Seq2SeqTrainingArguments(output_dir=str(tmp_path / lib.__name__), per_device_eval_batch_size=4,
                                        predict_with_generate=True, report_to="none", disable_tqdm=True,
                                        use_cpu=True, generation_max_length=5, **opts)
    trainer = lib.Seq2SeqTrainer(model=model, args=args, data_collator=_collate_for(model))
    processor = RecordingProcessor()
    predictions = trainer.predict(_Seq2SeqData(), logits_processor=transformers.LogitsProcessorList([processor]))
    return autocast, set(head), set(processor.dtypes), predictions.predictions


def test_bf16_generation_runs_under_autocast_with_float32_scores_as_upstream(tmp_path) -> None:
    import trainwell

    _, model = _tiny_t5()
    ours = _generate(trainwell, model, tmp_path, bf16=True)
    theirs = _generate(transformers, model, tmp_path, bf16=True)
    assert ours[0] and all(ours[0]) and ours[0] == theirs[0]  # every lm_head call inside autocast (generate + loss)
    assert ours[1] == theirs[1] == {"torch.bfloat16"}
    assert ours[2] == theirs[2] == {"torch.float32"}  # the logits processors get float32 scores
    np.testing.assert_array_equal(ours[3], theirs[3])


def test_without_mixed_precision_generation_stays_float32(tmp_path) -> None:
    import trainwell

    _, model = _tiny_t5()
    autocast, head, scores, _ = _generate(trainwell, model, tmp_path)
    assert not any(autocast) and head == scores == {"torch.float32"}
