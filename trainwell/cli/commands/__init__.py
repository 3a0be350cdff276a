"""The ``trainwell`` subcommands beyond ``train`` (registered by :mod:`trainwell.cli.main`): ``env``, ``plot``,
``generate``, ``run`` (each module's ``run(argv) -> exit status``) and DeepSpeed's ``zero-to-fp32`` and
``estimate-memory`` (:mod:`.deepspeed_tools`: ``cmd_zero_to_fp32``, ``cmd_estimate_memory``).

Each command imports its heavy dependencies (torch, matplotlib, deepspeed) only when it runs; usage errors are
raised as ``argparse.ArgumentError`` or ``CLIError`` and printed as one line by the CLI.
"""
