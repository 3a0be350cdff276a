"""Modules that exist to mirror upstream module names (``trainer_utils``, ``integrations``, ``debug_utils``) and
the TensorFlow trainer (tf/). The only layer allowed to re-export from anywhere; nothing inside trainwell imports it."""
