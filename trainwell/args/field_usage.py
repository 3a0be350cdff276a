"""Which ``TrainingArguments`` fields the library itself does not read, and why (checked by tests/test_no_stub_fields.py).

Every other field is read by trainwell (the training loop, the backends, the argument checks), or refused with an
error that says why and what to use (``REFUSED_FIELDS``). A field on none of these lists would be a silent stub.
"""

from __future__ import annotations

# Read by the user's own script (the example scripts' ``if training_args.do_train:``), not by the Trainer: upstream's
# Trainer does not read them either.
USER_SCRIPT_FIELDS: dict[str, str] = {
    "do_train": "the script decides whether to call trainer.train()",
    "do_eval": "the script decides whether to call trainer.evaluate() (eval_strategy sets it when not 'no')",
    "do_predict": "the script decides whether to call trainer.predict()",
    "resume_from_checkpoint": "the script passes it to trainer.train(resume_from_checkpoint=...)",
}

# Only meaningful to a feature that trainwell refuses with an error, so they configure nothing.
INERT_FIELDS: dict[str, str] = {
}

# Refused with an error by TrainingArguments._check_unimplemented when set (or, for some, when their package or
# device is missing): the value is looked at only to refuse it.
REFUSED_FIELDS: dict[str, dict] = {
    "use_ipex": {"use_ipex": True},
    "jit_mode_eval": {"jit_mode_eval": True},
    "mp_parameters": {"mp_parameters": "--partitions 2"},
    "tpu_num_cores": {"tpu_num_cores": 8},  # unless torch_xla is installed
    "tpu_metrics_debug": {"tpu_metrics_debug": True},  # unless torch_xla is installed
}
