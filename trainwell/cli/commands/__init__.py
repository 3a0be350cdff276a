"""The ``trainwell`` subcommands beyond ``train``: ``env``, ``plot``, ``generate``, ``run`` (registered by :mod:`trainwell.cli.main`).

Each module exposes ``run(argv) -> exit status`` and imports its heavy dependencies (torch, matplotlib) only when
it runs; usage errors are raised as ``argparse.ArgumentError`` or ``CLIError`` and printed as one line by the CLI.
"""
