"""TFTrainingArguments: the seed's fields and defaults, parsing, validation, and the strategy properties."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from trainwell import HfArgumentParser, TrainingArguments
from trainwell.tf import TFTrainingArguments

# Every field of seed 002's TFTrainingArguments signature (transformers 4.x), shared ones first.
SEED_FIELDS = """output_dir overwrite_output_dir do_train do_eval do_predict evaluation_strategy prediction_loss_only
per_device_train_batch_size per_device_eval_batch_size per_gpu_train_batch_size per_gpu_eval_batch_size
gradient_accumulation_steps eval_accumulation_steps learning_rate weight_decay adam_beta1 adam_beta2 adam_epsilon
max_grad_norm num_train_epochs max_steps lr_scheduler_type warmup_ratio warmup_steps logging_dir logging_strategy
logging_first_step logging_steps save_strategy save_steps save_total_limit no_cuda seed fp16 fp16_opt_level
fp16_backend fp16_full_eval local_rank tpu_num_cores tpu_metrics_debug debug dataloader_drop_last eval_steps
dataloader_num_workers past_index run_name disable_tqdm remove_unused_columns label_names load_best_model_at_end
metric_for_best_model greater_is_better ignore_data_skip sharded_ddp deepspeed label_smoothing_factor adafactor
group_by_length length_column_name report_to ddp_find_unused_parameters dataloader_pin_memory skip_memory_metrics
use_legacy_prediction_loop push_to_hub resume_from_checkpoint mp_parameters tpu_name tpu_zone gcp_project
poly_power xla""".split()


def test_has_every_field_of_the_seed_with_the_tf_defaults(tmp_path):
    names = {f.name for f in dataclasses.fields(TFTrainingArguments)}
    assert [n for n in SEED_FIELDS if n not in names] == []
    args = TFTrainingArguments(output_dir=str(tmp_path))
    assert (args.tpu_name, args.tpu_zone, args.gcp_project, args.poly_power, args.xla) == (None, None, None, 1.0,
                                                                                           False)
    assert isinstance(args, TrainingArguments) and args.framework == "tf"


def test_parses_through_hf_argument_parser(tmp_path):
    (args,) = HfArgumentParser(TFTrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--poly_power", "2.0", "--xla", "--tpu_name", "my-tpu", "--evaluation_strategy",
         "steps", "--eval_steps", "5", "--per_gpu_train_batch_size", "4"])
    assert (args.poly_power, args.xla, args.tpu_name, args.eval_steps) == (2.0, True, "my-tpu", 5)
    assert args.eval_strategy == "steps" and args.per_device_train_batch_size == 4  # deprecated names mapped
    assert "--poly_power" in HfArgumentParser(TFTrainingArguments).format_help()


def test_validation_names_the_field_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="poly_power must be > 0"):
        TFTrainingArguments(output_dir=str(tmp_path), poly_power=0)
    with pytest.raises(ValueError, match="pick one mixed-precision mode"):
        TFTrainingArguments(output_dir=str(tmp_path), fp16=True, bf16=True)
    with pytest.raises(TypeError, match="poly_power"):
        TFTrainingArguments(output_dir=str(tmp_path), poly_powr=2.0)


@pytest.mark.slow
def test_arguments_alone_do_not_import_tensorflow():
    code = ("import sys; from trainwell.tf import TFTrainingArguments; "
            "TFTrainingArguments(output_dir='x', report_to='none').to_json_string(); "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_strategy_properties_on_one_cpu(tmp_path):
    tf = pytest.importorskip("tensorflow")
    args = TFTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=3, per_device_eval_batch_size=5,
                               use_cpu=True)
    assert isinstance(args.strategy, tf.distribute.OneDeviceStrategy)
    assert args.strategy is args.strategy
    assert (args.n_replicas, args.train_batch_size, args.eval_batch_size) == (1, 3, 5)
    with pytest.warns(FutureWarning, match="n_replicas"):
        assert args.n_gpu == 1
    assert "_strategy_cache" not in args.to_dict()


def test_fp16_without_a_gpu_is_a_clear_error(tmp_path):
    pytest.importorskip("tensorflow")
    args = TFTrainingArguments(output_dir=str(tmp_path), fp16=True, use_cpu=True)
    with pytest.raises(ValueError, match="fp16=True needs a GPU.*bf16=True"):
        args.strategy


def test_an_unreachable_tpu_is_a_clear_error(tmp_path):
    pytest.importorskip("tensorflow")
    args = TFTrainingArguments(output_dir=str(tmp_path), tpu_name="no-such-tpu", tpu_zone="nowhere1-a")
    with pytest.raises(RuntimeError, match="Couldn't connect to TPU 'no-such-tpu'.*leave tpu_name unset"):
        args.strategy


def test_push_to_hub_is_refused_by_the_tf_trainer(tmp_path):
    with pytest.raises(NotImplementedError, match="push_to_hub is not supported by TFTrainer"):
        TFTrainingArguments(output_dir=str(tmp_path), push_to_hub=True)
