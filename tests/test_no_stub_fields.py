"""No argument is a silent stub: every TrainingArguments / Seq2SeqTrainingArguments field is read by trainwell, or
refused with an error, or on a short documented list (trainwell/field_usage.py, README "Arguments only scripts read")."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from trainwell import Seq2SeqTrainingArguments, TrainingArguments
from trainwell.args.fields import _RENAMED
from trainwell.args.field_usage import INERT_FIELDS, REFUSED_FIELDS, USER_SCRIPT_FIELDS

PACKAGE = Path(__file__).resolve().parents[1] / "trainwell"
FIELDS = sorted({f.name for cls in (TrainingArguments, Seq2SeqTrainingArguments) for f in dataclasses.fields(cls)})


def _source_without_definitions_and_refusals() -> str:
    """The package source minus the field definitions and the refusal function (a refusal is not a use)."""
    texts = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if path.name in ("args.py", "seq2seq_args.py"):
            text = re.sub(r"^    \w+: [^\n=]+= _f\(.*$", "", text, flags=re.M)  # `name: type = _f(default, help)`
            text = re.sub(r"    def _check_unimplemented\(self\).*?(?=\n    def )", "", text, flags=re.S)
        if path.name != "field_usage.py":
            texts.append(text)
    return "\n".join(texts)


SOURCE = _source_without_definitions_and_refusals()
# deprecated fields that __post_init__ moves into accelerator_config (which is then checked, see test_accelerator_config)
MOVED_INTO_ACCELERATOR_CONFIG = {"dispatch_batches", "split_batches"}


def _is_read(name: str) -> bool:
    return bool(re.search(rf"\.{name}\b", SOURCE) or re.search(rf"getattr\(\w+(\.\w+)*, \"{name}\"", SOURCE))


def test_every_field_is_read_refused_or_documented() -> None:
    stubs = [name for name in FIELDS
             if not (_is_read(name) or name in _RENAMED or name in USER_SCRIPT_FIELDS or name in INERT_FIELDS
                     or name in REFUSED_FIELDS or name in MOVED_INTO_ACCELERATOR_CONFIG)]
    assert stubs == [], f"fields neither read by trainwell, refused, nor documented: {stubs}"


def test_lists_name_real_fields_and_stay_short() -> None:
    for listing in (USER_SCRIPT_FIELDS, INERT_FIELDS, REFUSED_FIELDS):
        assert set(listing) <= set(FIELDS)
    assert len(USER_SCRIPT_FIELDS) + len(INERT_FIELDS) <= 12


@pytest.mark.parametrize("name", sorted(REFUSED_FIELDS))
def test_refused_fields_raise_with_the_reason(tmp_path, name: str) -> None:
    if name in ("tpu_num_cores", "tpu_metrics_debug") and importlib.util.find_spec("torch_xla") is not None:
        pytest.skip("torch_xla is installed: the TPU fields are accepted")
    with pytest.raises(NotImplementedError, match="is not supported: "):
        TrainingArguments(str(tmp_path), **REFUSED_FIELDS[name])


def test_no_field_is_accepted_with_a_no_effect_warning(tmp_path, caplog) -> None:
    """The old behaviour ("accepted for compatibility, no effect") is gone for good."""
    TrainingArguments(str(tmp_path), torch_empty_cache_steps=2, eval_use_gather_object=True,
                      average_tokens_across_devices=True, include_tokens_per_second=True)
    assert "no effect" not in caplog.text


# ------------------------------------------------------------------------------------- keys inside dict fields
BACKENDS = PACKAGE / "backends"
BACKEND_SOURCE = "\n".join(path.read_text() for path in sorted(BACKENDS.rglob("*.py")))
# fsdp_config keys FSDP2 honours by construction (documented in trainwell/backends/fsdp.py's docstring)
FSDP_BY_DESIGN = {"limit_all_gathers"}


def _fsdp_config_keys() -> set[str]:
    """Every key an ``accelerate launch`` FSDP config (all FSDP_* variables set) puts into ``fsdp_config``."""
    from trainwell.runtime.accelerate_env import _fsdp_settings

    env = {"FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "B",
           "FSDP_BACKWARD_PREFETCH": "BACKWARD_PRE", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}
    env.update({f"FSDP_{key}": "true" for key in ("ACTIVATION_CHECKPOINTING", "FORWARD_PREFETCH", "SYNC_MODULE_STATES",
                                                  "CPU_RAM_EFFICIENT_LOADING", "USE_ORIG_PARAMS")})
    keys = set(_fsdp_settings(env)[1])
    keys |= set(_fsdp_settings({"FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"})[1])
    return keys


def test_every_fsdp_config_key_is_read_by_the_fsdp_backend() -> None:
    keys = _fsdp_config_keys()
    assert {"sync_module_states", "state_dict_type", "use_orig_params", "backward_prefetch"} <= keys
    unread = [key for key in sorted(keys - FSDP_BY_DESIGN)
              if not re.search(rf"(\.get\(|\[)\"{key}\"", BACKEND_SOURCE)]
    assert unread == [], f"fsdp_config keys copied from the launch but never read by trainwell's FSDP backend: {unread}"



# DeepSpeed config keys the engine leaves to its caller (seed 001): trainwell must act on them itself.
DEEPSPEED_CALLER_KEYS = ["zero_optimization.stage", "zero_optimization.stage3_gather_16bit_weights_on_model_save"]


def test_deepspeed_keys_left_to_the_trainer_are_read() -> None:
    from trainwell.runtime.accelerate_env import _deepspeed_settings

    zero = _deepspeed_settings({"ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL": "true"})["zero_optimization"]
    assert "stage3_gather_16bit_weights_on_model_save" in zero  # the launch forwards it ...
    unread = [key for key in DEEPSPEED_CALLER_KEYS  # "section.key" or the key alone, quoted
              if not re.search(rf'"({re.escape(key)}|{re.escape(key.rsplit(".", 1)[-1])})"', BACKEND_SOURCE)]
    assert unread == [], f"DeepSpeed keys the trainer must honour but trainwell never reads: {unread}"
