"""``python -m trainwell`` runs the ``trainwell`` command."""

from .cli.main import main

raise SystemExit(main())
