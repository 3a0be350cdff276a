"""The ``trainwell`` command: the entry point and the train command (main.py), argument helpers (arguments.py),
the other commands (commands/) and the built-in recipes (recipes/).

The console script is ``trainwell.cli.main:console_main``: this package defines no ``main`` of its own, because the
submodule ``main`` is bound on the package as soon as it is imported and would shadow any function of that name.
"""
