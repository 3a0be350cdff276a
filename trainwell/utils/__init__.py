"""Small helpers with one job each, imported by every layer above: enums and outputs (trainer_utils.py), model
introspection, losses, override detection, preflight checks, logging, lazy exports, metric formatting, trackers."""
