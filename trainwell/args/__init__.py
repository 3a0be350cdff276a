"""Configuration as data: ``TrainingArguments`` (fields.py, the reference users read; validate.py, what
``__post_init__`` checks; runtime.py, the device and process properties resolved lazily), its seq2seq variant
(seq2seq.py), the argument parser (parser.py) and the bookkeeping of which fields a run read (field_usage.py)."""
