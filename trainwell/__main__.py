"""``python -m trainwell`` runs the ``trainwell`` command."""

from .cli.main import console_main

raise SystemExit(console_main())
