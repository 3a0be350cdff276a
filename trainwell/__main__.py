"""``python -m trainwell`` runs the ``trainwell`` command."""

from .cli import main

raise SystemExit(main())
