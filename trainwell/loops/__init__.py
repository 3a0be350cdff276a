"""The training and evaluation loops."""
