"""The folder ``trainwell run`` puts first on ``PYTHONPATH`` for the Python processes a script launches (its
``sitecustomize`` patches each of them); see :mod:`trainwell.cli.child_site.sitecustomize`."""
