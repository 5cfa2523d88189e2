"""`python -m cape ...` is the `cape` command (and `torchrun -m cape ...` its distributed form)."""

from .cli import main

raise SystemExit(main())
