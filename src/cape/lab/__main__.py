"""`python -m cape.lab ...` is the `cape` command (and `torchrun -m cape.lab ...` its distributed
form)."""

from cape.lab.cli import main

raise SystemExit(main())
