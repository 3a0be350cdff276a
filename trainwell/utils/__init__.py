"""Small helpers with one job each, imported by every layer above: the option enums, result tuples, seeding and
checkpoint folder names (option_enums.py, outputs.py, seeding.py, checkpoint_names.py), model introspection, losses,
override detection, preflight checks, logging, lazy exports, metric formatting, trackers."""
