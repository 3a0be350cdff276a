"""Optimisation: the optimizer factory and parameter groups (factory.py), the accepted names and the ``optim_args``
parser (names.py), the optional optimizer packages (extras.py) and the learning-rate schedules (schedules.py)."""
