"""Configuration as data: ``TrainingArguments`` (fields.py, the reference users read; validate.py, what
``__post_init__`` checks; runtime.py, the device and process properties resolved lazily; field_types.py, the
types of the fields those two mixins read, for the type checker), its seq2seq variant
(seq2seq.py), the argument parser (parser.py), the bookkeeping of which fields a run read (field_usage.py) and the
values of the fields transformers 5.2x added (data_options.py)."""
