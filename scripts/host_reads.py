"""How many times a forward of a 4-layer `TransformerEncoder` reads tensor values on the host
(each read a synchronisation on a GPU), per encoding, counted at `cape._checks`'s one gate.

    PYTHONPATH=src .venv/bin/python scripts/host_reads.py

Run it with an earlier cape on PYTHONPATH (a worktree of that commit) to compare versions.
"""

import sys
from collections import Counter

import torch

import cape
import cape._checks as checks
from cape.models import TransformerEncoder

CASES = {
    "cape1d": {},
    "rotary+CAPE": {"augmentation": cape.Augmentation(max_global_shift=5.0)},
    "alibi": {},
    "fire": {},
    "relpos": {},
}


def main() -> None:
    reads: Counter[str] = Counter()
    gate = checks._may_inspect_values

    def counted(t: torch.Tensor) -> bool:
        allowed = gate(t)
        reads["now"] += allowed
        return allowed

    # every module took the gate by name at import: swap it where it was taken
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("cape") and hasattr(
            module, "_may_inspect_values"
        ):
            module._may_inspect_values = counted
    for label, options in CASES.items():
        name = label.split("+")[0]
        torch.manual_seed(0)
        model = TransformerEncoder(4, 64, 4, 128, position=name, position_options=options).train()
        reads.clear()
        model(torch.randn(2, 50, 64))
        print(f"{label}: {reads['now']} host reads per forward (4 layers)")


if __name__ == "__main__":
    main()
